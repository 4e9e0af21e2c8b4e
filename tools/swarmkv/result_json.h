// JSON views of pipeline results shared by `swarmkv run --json` and
// `swarmkv bench`.
#pragma once

#include <optional>

#include <nlohmann/json.hpp>

#include "swarmkv/error.h"

#include "swarmkv/pipeline.h"

namespace swarmkv::cli {

// An agent's or the document's error: null when it succeeded, else
// {"code": "<stable code name>", "message": "..."}.
inline nlohmann::json error_json(const std::optional<ErrorValue>& error) {
  if (!error) return nullptr;
  return {{"code", std::string(to_string(error->code))}, {"message", error->message}};
}

// KV memory of a run: contexts, cells at the peak, measured bytes per cell,
// bytes in use and allocated, host snapshot buffers.
inline nlohmann::json memory_json(const PipelineResult& r) {
  return {{"contexts", r.contexts},
          {"kv_cells_peak", r.kv_cells_peak},
          {"kv_bytes_per_cell", r.kv_bytes_per_cell},
          {"kv_bytes_peak", r.kv_bytes_peak()},
          {"kv_bytes_allocated", r.kv_bytes_allocated()},
          {"host_buffer_bytes", r.host_buffer_bytes}};
}

}  // namespace swarmkv::cli
