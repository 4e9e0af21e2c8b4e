// Pipeline files: YAML (JSON is read as YAML too).
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {
namespace {

[[noreturn]] void bad(const std::string& file, const std::string& what) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", file, what));
}

// Unknown keys are errors: a typo ("max_token") must not be silently ignored.
void check_keys(const YAML::Node& node, const std::set<std::string>& allowed,
                const std::string& file, const std::string& where) {
  for (const auto& kv : node) {
    const auto key = kv.first.as<std::string>();
    if (!allowed.contains(key)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      bad(file, fmt::format("unknown key '{}' in {} (allowed: {})", key, where, list));
    }
  }
}

template <typename T>
T get(const YAML::Node& node, const char* key, T fallback, const std::string& file,
      const std::string& where) {
  if (!node[key]) return fallback;
  try {
    return node[key].as<T>();
  } catch (const YAML::Exception&) {
    bad(file,
        fmt::format("{}.{} has the wrong type (line {})", where, key, node[key].Mark().line + 1));
  }
}

std::vector<std::string> get_list(const YAML::Node& node, const char* key, const std::string& file,
                                  const std::string& where) {
  if (!node[key]) return {};
  if (node[key].IsScalar()) return {node[key].as<std::string>()};
  if (!node[key].IsSequence())
    bad(file, fmt::format("{}.{} must be a string or a list of strings", where, key));
  return get<std::vector<std::string>>(node, key, {}, file, where);
}

}  // namespace

PipelineSpec load_pipeline_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorCode::kNotFound, fmt::format("pipeline file '{}' does not exist", path));
  }
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    bad(path, fmt::format("not valid YAML/JSON: {}", e.what()));
  }
  if (!root.IsMap()) bad(path, "the top level must be a mapping");
  check_keys(root,
             {"name", "model", "n_ctx", "n_batch", "threads", "fork", "system", "document",
              "defaults", "agents"},
             path, "the pipeline");

  PipelineSpec spec;
  const std::string top = "pipeline";
  spec.name =
      get<std::string>(root, "name", std::filesystem::path(path).stem().string(), path, top);
  spec.model = get<std::string>(root, "model", "", path, top);
  spec.n_ctx = get<uint32_t>(root, "n_ctx", spec.n_ctx, path, top);
  spec.n_batch = get<uint32_t>(root, "n_batch", spec.n_batch, path, top);
  spec.n_threads = get<int32_t>(root, "threads", spec.n_threads, path, top);
  spec.system_prompt = get<std::string>(root, "system", spec.system_prompt, path, top);
  spec.fork =
      parse_fork_mode(get<std::string>(root, "fork", std::string(to_string(spec.fork)), path, top));
  const auto base = std::filesystem::path(path).parent_path();
  if (!spec.model.empty() && std::filesystem::path(spec.model).is_relative()) {
    spec.model = (base / spec.model).string();
  }

  const YAML::Node doc = root["document"];
  if (!doc) bad(path, "missing 'document' (use document: {file: PATH} or document: {text: ...})");
  if (doc.IsScalar()) {
    spec.document = doc.as<std::string>();
    spec.document_source = "text";
  } else {
    if (!doc.IsMap()) bad(path, "'document' must be a mapping with 'file' or 'text'");
    check_keys(doc, {"file", "text"}, path, "document");
    if (doc["file"] && doc["text"]) bad(path, "document: give either 'file' or 'text', not both");
    if (doc["file"]) {
      auto file = std::filesystem::path(doc["file"].as<std::string>());
      if (file.is_relative()) file = base / file;
      if (!std::filesystem::is_regular_file(file, ec)) {
        throw Error(ErrorCode::kNotFound,
                    fmt::format("{}: document file '{}' does not exist", path, file.string()));
      }
      spec.document = read_file(file.string());
      spec.document_source = "file:" + file.string();
    } else if (doc["text"]) {
      spec.document = doc["text"].as<std::string>();
      spec.document_source = "text";
    } else {
      bad(path, "document: needs 'file' or 'text'");
    }
  }

  // The sampling keys, the same in `defaults` and in each agent.
  const std::set<std::string> sampling_keys = {"temperature",
                                               "top_p",
                                               "top_k",
                                               "seed",
                                               "repeat_penalty",
                                               "repeat_last_n",
                                               "frequency_penalty",
                                               "presence_penalty",
                                               "dry_multiplier",
                                               "dry_base",
                                               "dry_allowed_length",
                                               "dry_penalty_last_n"};
  const auto read_sampling = [&](const YAML::Node& n, SamplingOptions& s,
                                 const std::string& where) {
    s.temperature = get<float>(n, "temperature", s.temperature, path, where);
    s.top_p = get<float>(n, "top_p", s.top_p, path, where);
    s.top_k = get<int32_t>(n, "top_k", s.top_k, path, where);
    s.seed = get<uint32_t>(n, "seed", s.seed, path, where);
    s.repeat_penalty = get<float>(n, "repeat_penalty", s.repeat_penalty, path, where);
    s.repeat_last_n = get<int32_t>(n, "repeat_last_n", s.repeat_last_n, path, where);
    s.frequency_penalty = get<float>(n, "frequency_penalty", s.frequency_penalty, path, where);
    s.presence_penalty = get<float>(n, "presence_penalty", s.presence_penalty, path, where);
    s.dry_multiplier = get<float>(n, "dry_multiplier", s.dry_multiplier, path, where);
    s.dry_base = get<float>(n, "dry_base", s.dry_base, path, where);
    s.dry_allowed_length = get<int32_t>(n, "dry_allowed_length", s.dry_allowed_length, path, where);
    s.dry_penalty_last_n = get<int32_t>(n, "dry_penalty_last_n", s.dry_penalty_last_n, path, where);
  };
  std::set<std::string> agent_keys = {"name", "prompt", "max_tokens", "stop", "depends_on"};
  agent_keys.insert(sampling_keys.begin(), sampling_keys.end());
  AgentSpec defaults;
  if (const YAML::Node d = root["defaults"]) {
    std::set<std::string> default_keys = {"max_tokens", "stop"};
    default_keys.insert(sampling_keys.begin(), sampling_keys.end());
    check_keys(d, default_keys, path, "defaults");
    defaults.max_tokens = get<int32_t>(d, "max_tokens", defaults.max_tokens, path, "defaults");
    read_sampling(d, defaults.sampling, "defaults");
    defaults.stop = get_list(d, "stop", path, "defaults");
  }
  const YAML::Node agents = root["agents"];
  if (!agents || !agents.IsSequence() || agents.size() == 0)
    bad(path, "'agents' must be a non-empty list");
  for (size_t i = 0; i < agents.size(); ++i) {
    const YAML::Node a = agents[i];
    const std::string where = fmt::format("agents[{}]", i);
    if (!a.IsMap()) bad(path, where + " must be a mapping");
    check_keys(a, agent_keys, path, where);
    AgentSpec agent = defaults;
    agent.name = get<std::string>(a, "name", "", path, where);
    if (agent.name.empty()) bad(path, where + " needs a 'name'");
    agent.prompt = get<std::string>(a, "prompt", "", path, where);
    agent.max_tokens = get<int32_t>(a, "max_tokens", agent.max_tokens, path, where);
    read_sampling(a, agent.sampling, where);
    if (a["stop"]) agent.stop = get_list(a, "stop", path, where);
    agent.depends_on = get_list(a, "depends_on", path, where);
    spec.agents.push_back(std::move(agent));
  }
  return spec;
}

}  // namespace swarmkv
