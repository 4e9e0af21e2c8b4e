// A run as one self-contained HTML page: the agents' graph, a timeline of
// the document's prefill and every agent, and each agent's prompt and
// answer, drawn from a run's result (result_json(), or a saved `run --json`).
// No script and nothing fetched: styles inline, the graph and the timeline
// inline SVG; readable without colour (edges differ by dash pattern, status
// is written out).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace swarmkv {

// The page. `source`: where the result came from, shown in the header (a
// file name, or "" for a run just made). A result with "live" (a run still
// going on, as `swarmkv serve` shows it: agents "waiting" and "running")
// gets a "state" line; `refresh_s` > 0 makes the page reload itself that
// often (a <meta> refresh, no script). Throws Error(kCorruption) naming
// the first key the page needs that `result` lacks or has with another type
// ("the result has no 'agents' (not a swarmkv run --json result?)").
std::string run_page_html(const nlohmann::json& result, const std::string& source = "",
                          int refresh_s = 0);

// A corpus's page (corpus_json(), or a saved `run --json` of a corpus): a
// table with a row per document and a column per agent (each answer, a
// JSON answer's fields, or the error), then the reduce agents as a run's
// page lists its agents. Throws Error(kCorruption) "the result has no
// 'documents' (...)" or naming what does not read. `refresh_s` > 0: the
// page reloads itself that often (a corpus still running on a server).
std::string corpus_page_html(const nlohmann::json& corpus, const std::string& source = "",
                             int refresh_s = 0);

// One run in a server's list.
struct RunSummary {
  std::string id;        // its page is runs/<id>
  std::string pipeline;  // its name
  std::string state;     // "queued", "running", "ok" or "failed"
  size_t agents = 0;
  size_t agents_done = 0;
  std::string accepted;   // when the server took it, as text
  double elapsed_ms = 0;  // from its start to its end, or to now
};

// The list of runs `swarmkv serve` keeps (GET /), each linking to its page;
// `server` names it in the title. While one is queued or running the page
// reloads every `refresh_s` seconds (> 0).
std::string runs_index_html(const std::vector<RunSummary>& runs, const std::string& server,
                            int refresh_s);

}  // namespace swarmkv
