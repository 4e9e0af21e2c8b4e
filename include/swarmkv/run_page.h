// A run as one self-contained HTML page: the agents' graph, a timeline of
// the document's prefill and every agent, and each agent's prompt and
// answer, drawn from a run's result (result_json(), or a saved `run --json`).
// No script and nothing fetched: styles inline, the graph and the timeline
// inline SVG; readable without colour (edges differ by dash pattern, status
// is written out).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace swarmkv {

// The page. `source`: where the result came from, shown in the header (a
// file name, or "" for a run just made). Throws Error(kCorruption) naming
// the first key the page needs that `result` lacks or has with another type
// ("the result has no 'agents' (not a swarmkv run --json result?)").
std::string run_page_html(const nlohmann::json& result, const std::string& source = "");

}  // namespace swarmkv
