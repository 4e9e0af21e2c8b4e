// What the coordinator and the workers send each other, as JSON.
#include <charconv>

#include <fmt/format.h>

#include "cluster/keys.h"
#include "swarmkv/error.h"

namespace swarmkv::cluster {

std::vector<StreamEntry> stream_entries(const redis::Reply& list) {
  std::vector<StreamEntry> out;
  for (const redis::Reply& e : list.elements) {
    if (e.elements.size() < 2) continue;
    StreamEntry entry;
    entry.id = e.elements[0].str;
    const auto& kv = e.elements[1].elements;
    for (size_t i = 0; i + 1 < kv.size(); i += 2) entry.fields[kv[i].str] = kv[i + 1].str;
    out.push_back(std::move(entry));
  }
  return out;
}

int64_t redis_time_ms(redis::Client& redis) {
  const redis::Reply r = redis.command({"TIME"});
  int64_t s = 0, us = 0;
  if (r.elements.size() != 2 ||
      std::from_chars(r.elements[0].str.data(), r.elements[0].str.data() + r.elements[0].str.size(),
                      s)
              .ec != std::errc() ||
      std::from_chars(r.elements[1].str.data(), r.elements[1].str.data() + r.elements[1].str.size(),
                      us)
              .ec != std::errc()) {
    throw Error(ErrorCode::kIo, "Redis answered TIME with something other than two numbers");
  }
  return s * 1000 + us / 1000;
}

std::optional<std::string> stale_heartbeat(const nlohmann::json& doc, int64_t now_ms) {
  const auto at = doc.find(kHeartbeatAtField), ttl = doc.find(kHeartbeatTtlField);
  if (at == doc.end() || ttl == doc.end() || !at->is_number_integer() || !ttl->is_number_integer())
    return "its heartbeat carries no time (a worker older than this coordinator?)";
  const int64_t age = now_ms - at->get<int64_t>();
  if (age > ttl->get<int64_t>()) {
    return fmt::format(
        "its heartbeat is {:.1f} s old, past its {:.1f} s life: written again since (a replay?)",
        age / 1000.0, ttl->get<int64_t>() / 1000.0);
  }
  return std::nullopt;
}

nlohmann::json spec_to_json(const PipelineSpec& spec, GuardPolicy guard) {
  nlohmann::json pipeline = pipeline_json(spec);
  // The worker's own: its model file (the job stream is per model), threads
  // and GPU layers (worker --n-gpu-layers).
  for (const char* local : {"model", "threads", "threads_batch", "n_gpu_layers"})
    pipeline.erase(local);
  return {{"pipeline", std::move(pipeline)},
          {"document_source", spec.document_source},
          {"guard", std::string(to_string(guard))}};
}

PipelineSpec spec_from_json(const nlohmann::json& j, GuardPolicy* guard) {
  try {
    PipelineSpec spec = parse_pipeline_json(j.at("pipeline"), "pipeline", "");
    j.at("document_source").get_to(spec.document_source);
    if (guard != nullptr) *guard = parse_guard_policy(j.at("guard").get<std::string>());
    return spec;
  } catch (const Error& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("a pipeline message does not parse: {}", e.message()));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("a pipeline message does not parse: {}", e.what()));
  }
}

}  // namespace swarmkv::cluster
