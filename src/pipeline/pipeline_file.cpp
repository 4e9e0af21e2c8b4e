// Pipeline files: YAML, or JSON read as JSON (nlohmann) and handed to the
// same reader as a YAML tree, so that both follow one set of rules.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <type_traits>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>
#include <nlohmann/json.hpp>

#include "pipeline/corpus_spec.h"
#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {
namespace {

class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void bad(const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", origin_, what));
  }
  // " (line N)" for a node read from YAML text; "" for one made from JSON,
  // whose parser keeps no positions (its messages name the key alone).
  static std::string at(const YAML::Node& node) {
    return node.Mark().is_null() ? std::string() : fmt::format(" (line {})", node.Mark().line + 1);
  }
  static int line(const YAML::Node& node) { return node.Mark().line + 1; }

  // Unknown keys are errors: a typo ("max_token") must not be silently
  // ignored; so is a key given twice (YAML keeps the first, silently).
  void check_keys(const YAML::Node& node, const std::set<std::string>& allowed,
                  const std::string& where) const {
    std::map<std::string, int> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar())
        bad(fmt::format("{} has a key that is not a name{}", where, at(kv.first)));
      const auto key = kv.first.Scalar();
      if (!allowed.contains(key)) {
        std::string list;
        for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
        const std::string line_of =
            kv.first.Mark().is_null() ? "" : fmt::format("line {}; ", line(kv.first));
        bad(fmt::format("unknown key '{}' in {} ({}allowed: {})", key, where, line_of, list));
      }
      if (const auto [it, fresh] = seen.emplace(key, line(kv.first)); !fresh) {
        bad(fmt::format("key '{}' is given twice in {} (lines {} and {})", key, where, it->second,
                        line(kv.first)));
      }
    }
  }

  // A scalar value; an empty one (`prompt:`) is an error, not the text "null".
  YAML::Node scalar(const YAML::Node& value, const std::string& what) const {
    if (value.IsNull()) bad(fmt::format("{} has no value{}", what, at(value)));
    if (!value.IsScalar()) {
      bad(fmt::format("{} must be a single value, not a {}{}", what,
                      value.IsSequence() ? "list" : "mapping", at(value)));
    }
    return value;
  }

  std::string text(const YAML::Node& node, const char* key, std::string fallback,
                   const std::string& where) const {
    if (!node[key]) return fallback;
    return scalar(node[key], where + "." + key).Scalar();
  }

  // An integer in [lo, hi], named with its line when it is not. A number
  // written with a fraction or an exponent counts when its value is whole
  // (JSON has one number type: 1e1 and 10.0 are 10); a quoted value is a
  // string, in YAML as in JSON.
  int64_t integer(const YAML::Node& node, const char* key, int64_t fallback, int64_t lo, int64_t hi,
                  const std::string& where) const {
    if (!node[key]) return fallback;
    const YAML::Node v = scalar(node[key], where + "." + key);
    const auto refuse = [&] {
      bad(fmt::format("{}.{} must be an integer, got {}{}", where, key, shown(v), at(v)));
    };
    if (quoted(v)) refuse();
    int64_t out = 0;
    try {
      out = v.as<int64_t>();
    } catch (const YAML::Exception&) {
      const std::optional<double> d = plain_number(v);
      // 2^63 is the first double past int64's range.
      if (!d || *d != std::trunc(*d) || std::abs(*d) >= 9.2233720368547758e18) refuse();
      out = static_cast<int64_t>(*d);
    }
    if (out < lo || out > hi) {
      bad(fmt::format("{}.{} must be in {}..{}, got {}{}", where, key, lo, hi, out, at(v)));
    }
    return out;
  }

  // true or false (any case, as YAML 1.2 and JSON write them): YAML 1.1's
  // yes/no/on/off are not booleans, nor is a quoted "true".
  bool boolean(const YAML::Node& node, const char* key, bool fallback,
               const std::string& where) const {
    if (!node[key]) return fallback;
    const YAML::Node v = scalar(node[key], where + "." + key);
    if (!quoted(v)) {
      std::string t = v.Scalar();
      if (t == "true" || t == "True" || t == "TRUE") return true;
      if (t == "false" || t == "False" || t == "FALSE") return false;
    }
    bad(fmt::format("{}.{} must be true or false, got {}{}", where, key, shown(v), at(v)));
  }

  float real(const YAML::Node& node, const char* key, float fallback,
             const std::string& where) const {
    if (!node[key]) return fallback;
    const YAML::Node v = scalar(node[key], where + "." + key);
    if (!quoted(v)) {
      if (const std::optional<double> d = plain_number(v)) return static_cast<float>(*d);
    }
    bad(fmt::format("{}.{} must be a number, got {}{}", where, key, shown(v), at(v)));
  }

  std::vector<std::string> list(const YAML::Node& node, const char* key,
                                const std::string& where) const {
    const YAML::Node v = node[key];
    if (!v) return {};
    if (v.IsScalar()) return {v.Scalar()};
    if (!v.IsSequence()) {
      bad(fmt::format("{}.{} must be a string or a list of strings{}", where, key, at(v)));
    }
    std::vector<std::string> out;
    for (size_t i = 0; i < v.size(); ++i)
      out.push_back(scalar(v[i], fmt::format("{}.{}[{}]", where, key, i)).Scalar());
    return out;
  }

 private:
  // A value written in quotes (YAML's '...' or "...", any JSON string).
  static bool quoted(const YAML::Node& v) { return v.Tag() == "!"; }
  static std::string shown(const YAML::Node& v) {
    return quoted(v) ? fmt::format("the string \"{}\"", v.Scalar())
                     : fmt::format("'{}'", v.Scalar());
  }
  // A plain scalar that reads whole as a number (as JSON writes one).
  static std::optional<double> plain_number(const YAML::Node& v) {
    const std::string& t = v.Scalar();
    if (t.empty() || !(std::isdigit(static_cast<unsigned char>(t[0])) || t[0] == '-' ||
                       t[0] == '+' || t[0] == '.')) {
      return std::nullopt;
    }
    try {
      return v.as<double>();
    } catch (const YAML::Exception&) {
      return std::nullopt;
    }
  }

  std::string origin_;
};

constexpr int64_t kMaxInt32 = std::numeric_limits<int32_t>::max();

// The top-level settings: name, model (relative to the file), engine
// settings, fork, system prompt.
void read_settings(const Reader& r, const YAML::Node& root, const std::filesystem::path& base,
                   const std::string& default_name, PipelineSpec& spec) {
  const std::string top = "pipeline";
  spec.name = r.text(root, "name", default_name, top);
  spec.model = r.text(root, "model", "", top);
  spec.n_ctx = static_cast<uint32_t>(r.integer(root, "n_ctx", spec.n_ctx, 0, 1 << 24, top));
  spec.n_batch = static_cast<uint32_t>(r.integer(root, "n_batch", spec.n_batch, 1, 1 << 16, top));
  spec.n_ubatch =
      static_cast<uint32_t>(r.integer(root, "n_ubatch", spec.n_ubatch, 0, spec.n_batch, top));
  spec.n_threads =
      static_cast<int32_t>(r.integer(root, "threads", spec.n_threads, 0, hardware_threads(), top));
  spec.n_threads_batch = static_cast<int32_t>(
      r.integer(root, "threads_batch", spec.n_threads_batch, 0, hardware_threads(), top));
  spec.flash_attn = r.boolean(root, "flash_attn", spec.flash_attn, top);
  spec.exact = r.boolean(root, "exact", spec.exact, top);
  spec.n_gpu_layers =
      static_cast<int32_t>(r.integer(root, "n_gpu_layers", spec.n_gpu_layers, -1, 1 << 16, top));
  spec.max_live = static_cast<int32_t>(r.integer(root, "max_live", spec.max_live, 0, 1 << 16, top));
  if (root["kv_type"]) {
    try {
      spec.kv_type = parse_kv_type(r.text(root, "kv_type", "", top));
    } catch (const Error& e) {
      r.bad(e.message() + Reader::at(root["kv_type"]));
    }
  }
  spec.system_prompt = r.text(root, "system", spec.system_prompt, top);
  if (root["fork"]) {
    try {
      spec.fork = parse_fork_mode(r.text(root, "fork", "", top));
    } catch (const Error& e) {
      r.bad(e.message() + Reader::at(root["fork"]));
    }
  }
  if (!spec.model.empty() && std::filesystem::path(spec.model).is_relative()) {
    spec.model = (base / spec.model).string();
  }
}

// `documents`: a list of files, globs and folders (relative to the file),
// {file: PATH} and {text: ..., name: N} items.
std::vector<DocumentRef> read_documents(const Reader& r, const YAML::Node& list,
                                        const std::filesystem::path& base,
                                        const std::string& origin) {
  if (!list.IsSequence() || list.size() == 0) {
    r.bad(
        fmt::format("'documents' must be a non-empty list of files, globs, folders, "
                    "{{file: PATH}} or {{text: ..., name: N}}{}",
                    Reader::at(list)));
  }
  std::vector<DocumentRef> out;
  for (size_t i = 0; i < list.size(); ++i) {
    const YAML::Node item = list[i];
    const std::string where = fmt::format("documents[{}]", i);
    std::vector<DocumentRef> found;
    try {
      if (item.IsScalar()) {
        found = detail::expand_documents(r.scalar(item, where).Scalar(), base);
      } else if (item.IsMap()) {
        r.check_keys(item, {"file", "text", "name"}, where);
        if (item["file"] && item["text"]) r.bad(where + ": give either 'file' or 'text', not both");
        if (item["file"]) {
          if (item["name"]) r.bad(where + ": a file's name is its file name; 'name' is for text");
          auto file = std::filesystem::path(r.text(item, "file", "", where));
          if (file.is_relative()) file = base / file;
          found.push_back(detail::checked_document_file(file));
        } else if (item["text"]) {
          DocumentRef doc;
          doc.text = r.text(item, "text", "", where);
          doc.name = r.text(item, "name", fmt::format("text-{}", i + 1), where);
          found.push_back(std::move(doc));
        } else {
          r.bad(where + ": needs 'file' or 'text'");
        }
      } else {
        r.bad(
            fmt::format("{} must be a file, glob or folder, or a mapping with 'file' or "
                        "'text'{}",
                        where, Reader::at(item)));
      }
    } catch (const Error& e) {
      if (e.message().starts_with(origin)) throw;
      throw Error(e.code(), fmt::format("{}: {}: {}", origin, where, e.message()));
    }
    for (DocumentRef& d : found) out.push_back(std::move(d));
  }
  return out;
}

// `document`: text, or {file: PATH} (relative to the file) or {text: ...}.
void read_document(const Reader& r, const YAML::Node& root, const std::filesystem::path& base,
                   const std::string& origin, PipelineSpec& spec) {
  const YAML::Node doc = root["document"];
  if (!doc) r.bad("missing 'document' (use document: {file: PATH} or document: {text: ...})");
  if (doc.IsScalar() || doc.IsNull()) {
    spec.document = r.scalar(doc, "document").Scalar();
    spec.document_source = "text";
    return;
  }
  if (!doc.IsMap())
    r.bad(fmt::format("'document' must be a mapping with 'file' or 'text'{}", Reader::at(doc)));
  r.check_keys(doc, {"file", "text"}, "document");
  if (doc["file"] && doc["text"]) r.bad("document: give either 'file' or 'text', not both");
  if (doc["file"]) {
    auto file = std::filesystem::path(r.text(doc, "file", "", "document"));
    if (file.is_relative()) file = base / file;
    spec.document = read_file(file.string(), fmt::format("{}: document file", origin));
    spec.document_source = "file:" + file.string();
  } else if (doc["text"]) {
    spec.document = r.text(doc, "text", "", "document");
    spec.document_source = "text";
  } else {
    r.bad("document: needs 'file' or 'text'");
  }
}

// A YAML value as JSON (a JSON Schema written in YAML), keys in their
// order (a schema's properties are generated in it): a quoted scalar is a
// string; a plain one null, a boolean or a number where it reads as one,
// else a string. JSON's strings arrive quoted (yaml_tree tags them so).
nlohmann::ordered_json json_value(const YAML::Node& n) {
  if (n.IsNull()) return nullptr;
  if (n.IsSequence()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const YAML::Node& v : n) out.push_back(json_value(v));
    return out;
  }
  if (n.IsMap()) {
    nlohmann::ordered_json out = nlohmann::ordered_json::object();
    for (const auto& kv : n) out[kv.first.Scalar()] = json_value(kv.second);
    return out;
  }
  const std::string& text = n.Scalar();
  if (n.Tag() == "!") return text;
  if (text == "null" || text == "~") return nullptr;
  if (text == "true" || text == "false") return text == "true";
  if (!text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-')) {
    nlohmann::ordered_json number =
        nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (number.is_number()) return number;
  }
  return text;
}

// `defaults` and each of `agents`: the sampling keys are the same in both.
class AgentReader {
 public:
  AgentReader(const Reader& r, std::filesystem::path base, std::string origin)
      : r_(r), base_(std::move(base)), origin_(std::move(origin)) {
    SamplingOptions probe;
    for_each_sampling_field(probe,
                            [&](const char* key, auto&, int64_t) { sampling_keys_.insert(key); });
  }

  AgentSpec defaults(const YAML::Node& d) const {
    AgentSpec defaults;
    if (!d) return defaults;
    if (!d.IsMap()) r_.bad(fmt::format("'defaults' must be a mapping{}", Reader::at(d)));
    std::set<std::string> default_keys = {"max_tokens", "stop", "json_schema", "grammar",
                                          "logit_bias"};
    default_keys.insert(sampling_keys_.begin(), sampling_keys_.end());
    r_.check_keys(d, default_keys, "defaults");
    defaults.max_tokens = static_cast<int32_t>(
        r_.integer(d, "max_tokens", defaults.max_tokens, 1, kMaxInt32, "defaults"));
    sampling(d, defaults.sampling, "defaults");
    structure(d, defaults, "defaults");
    defaults.stop = stop(d, "defaults");
    return defaults;
  }

  AgentSpec agent(const YAML::Node& a, size_t i, const AgentSpec& defaults) const {
    const std::string where = fmt::format("agents[{}]", i);
    if (!a.IsMap()) r_.bad(fmt::format("{} must be a mapping{}", where, Reader::at(a)));
    std::set<std::string> agent_keys = {"name",        "prompt",     "max_tokens", "stop",
                                        "depends_on",  "priority",   "fork_from",  "needs",
                                        "json_schema", "grammar",    "logit_bias", "scope",
                                        "tools",       "tool_choice"};
    agent_keys.insert(sampling_keys_.begin(), sampling_keys_.end());
    r_.check_keys(a, agent_keys, where);
    AgentSpec agent = defaults;
    if (!a["name"]) r_.bad(fmt::format("{} needs a 'name'{}", where, Reader::at(a)));
    agent.name = r_.text(a, "name", "", where);
    if (!a["prompt"]) r_.bad(fmt::format("{} needs a 'prompt'{}", where, Reader::at(a)));
    if (a["prompt"].IsMap() && !a["prompt"].Mark().is_null()) {  // YAML's '{' trap
      r_.bad(
          fmt::format("{}.prompt is a mapping, not text (line {}): in YAML a value that starts "
                      "with '{{' is one; quote a prompt that starts with a placeholder: prompt: "
                      "\"{{{{name}}}} ...\"",
                      where, Reader::line(a["prompt"])));
    }
    agent.prompt = r_.text(a, "prompt", "", where);
    agent.max_tokens =
        static_cast<int32_t>(r_.integer(a, "max_tokens", agent.max_tokens, 1, kMaxInt32, where));
    sampling(a, agent.sampling, where);
    structure(a, agent, where);
    tools(a, agent, where);
    if (a["stop"]) agent.stop = stop(a, where);
    agent.depends_on = r_.list(a, "depends_on", where);
    agent.fork_from = r_.text(a, "fork_from", "", where);
    if (const YAML::Node n = a["needs"]) agent.needs = needs(n, where);
    agent.priority =
        static_cast<int32_t>(r_.integer(a, "priority", agent.priority, -(1 << 20), 1 << 20, where));
    return agent;
  }

 private:
  void sampling(const YAML::Node& n, SamplingOptions& s, const std::string& where) const {
    for_each_sampling_field(s, [&](const char* key, auto& value, int64_t least) {
      using T = std::remove_reference_t<decltype(value)>;
      if constexpr (std::is_floating_point_v<T>) {
        value = r_.real(n, key, value, where);
      } else {
        value =
            static_cast<T>(r_.integer(n, key, value, least, std::numeric_limits<T>::max(), where));
      }
    });
    logit_bias(n, s, where);
    try {
      validate_sampling(s);
    } catch (const Error& e) {
      r_.bad(fmt::format("{}{}: {}", where, Reader::at(n), e.message()));
    }
  }

  // `logit_bias: {TOKEN_ID: BIAS, ...}` (OpenAI's, bias in [-100, 100]);
  // null clears a default's. The ids are checked against the model's
  // vocabulary once it loads (prepare_pipeline).
  void logit_bias(const YAML::Node& n, SamplingOptions& s, const std::string& where) const {
    const YAML::Node m = n["logit_bias"];
    if (!m) return;
    s.logit_bias.clear();
    if (m.IsNull()) return;
    const std::string key = where + ".logit_bias";
    if (!m.IsMap())
      r_.bad(fmt::format("{} must be a mapping of token id: bias{}", key, Reader::at(m)));
    for (const auto& kv : m) {
      const std::string id = kv.first.Scalar();
      int64_t token = -1;
      try {
        token = kv.first.as<int64_t>();
      } catch (const YAML::Exception&) {
      }
      if (token < 0 || token > kMaxInt32) {
        r_.bad(fmt::format("{}.{}: a key must be a token id (an integer >= 0){}", key, id,
                           Reader::at(kv.first)));
      }
      const float bias = r_.real(m, id.c_str(), 0.0f, key);
      if (!(bias >= -100.0f && bias <= 100.0f)) {
        r_.bad(fmt::format("{}.{} must be in -100..100, got {}{}", key, id, bias,
                           Reader::at(kv.second)));
      }
      s.logit_bias.emplace_back(static_cast<Token>(token), bias);
    }
    // By id: the spec's JSON (an object, keys in text order) reads back the same.
    std::sort(s.logit_bias.begin(), s.logit_bias.end());
  }

  // `json_schema:` (the schema, its JSON text as a string, or {file: PATH}
  // of a JSON file) or `grammar:` (GBNF text, or {file: PATH}); null for
  // free text (over a default). The schema keeps its keys' order (its
  // properties are generated in it) and becomes its grammar here, so that
  // one the converter cannot handle is refused with the file, before any
  // model loads.
  void structure(const YAML::Node& n, AgentSpec& agent, const std::string& where) const {
    const YAML::Node schema = n["json_schema"];
    const YAML::Node grammar = n["grammar"];
    if (schema && grammar) {
      r_.bad(fmt::format("{}: give either 'json_schema' or 'grammar', not both{}", where,
                         Reader::at(n)));
    }
    if (!schema && !grammar) return;
    agent.json_schema.clear();
    agent.sampling.grammar.clear();
    if (schema && !schema.IsNull()) {
      const std::string key = where + ".json_schema";
      nlohmann::ordered_json value;
      if (const std::optional<std::string> file = file_form(schema, key)) {
        value = nlohmann::ordered_json::parse(*file, nullptr, /*allow_exceptions=*/false);
        if (value.is_discarded())
          r_.bad(fmt::format("{}: the file is not JSON{}", key, Reader::at(schema)));
      } else if (schema.IsScalar() && schema.Tag() == "!") {
        // Its JSON text (pipeline_json writes it so, keeping the order).
        value = nlohmann::ordered_json::parse(schema.Scalar(), nullptr,
                                              /*allow_exceptions=*/false);
        if (!value.is_object()) {
          r_.bad(fmt::format("{}: a string must be a schema's JSON text, an object{}", key,
                             Reader::at(schema)));
        }
      } else {
        value = json_value(schema);
      }
      agent.json_schema = value.dump();
      try {
        agent.sampling.grammar = grammar_from_json_schema(agent.json_schema);
      } catch (const Error& e) {
        r_.bad(fmt::format("{}{}: {}", key, Reader::at(schema), e.message()));
      }
    }
    if (grammar && !grammar.IsNull()) {
      const std::string key = where + ".grammar";
      const std::optional<std::string> file = file_form(grammar, key);
      agent.sampling.grammar = file ? *file : r_.scalar(grammar, key).Scalar();
      if (agent.sampling.grammar.find_first_not_of(" \t\r\n") == std::string::npos)
        r_.bad(fmt::format("{} is empty{}", key, Reader::at(grammar)));
    }
  }

  // `tools:` (a list of functions, OpenAI's {type: function, function:
  // {...}} or the inner {name, description, parameters}; or their JSON text,
  // as pipeline_json writes them) and `tool_choice:` (`required`, the
  // default: a call of any of them; `auto`: a call or text; or one's name):
  // the answer is a call (call_tools), so neither json_schema nor grammar
  // may be given beside.
  void tools(const YAML::Node& n, AgentSpec& agent, const std::string& where) const {
    const YAML::Node list = n["tools"];
    const YAML::Node choice = n["tool_choice"];
    if (choice && (!list || list.IsNull())) {
      r_.bad(fmt::format("{}.tool_choice needs 'tools'{}", where, Reader::at(choice)));
    }
    if (!list || list.IsNull()) return;
    const std::string key = where + ".tools";
    if (n["json_schema"] || n["grammar"]) {
      r_.bad(fmt::format("{}: give 'tools' or '{}', not both (tools make the answer a call){}",
                         where, n["json_schema"] ? "json_schema" : "grammar", Reader::at(list)));
    }
    nlohmann::ordered_json value;
    if (list.IsScalar() && list.Tag() == "!") {
      value = nlohmann::ordered_json::parse(list.Scalar(), nullptr, /*allow_exceptions=*/false);
    } else {
      value = json_value(list);
    }
    // The shared functions' errors name the field; the line is added here.
    const auto checked = [&](const YAML::Node& at, auto&& f) {
      try {
        return f();
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kInvalidArgument) throw;
        r_.bad(fmt::format("{}{}", e.message(), Reader::at(at)));
      }
    };
    std::vector<ToolFunction> functions =
        checked(list, [&] { return tools_from_json(value, key); });
    if (functions.empty()) r_.bad(fmt::format("{} is empty{}", key, Reader::at(list)));
    bool or_text = false;
    if (choice) {
      const std::string chosen = r_.scalar(choice, where + ".tool_choice").Scalar();
      if (chosen == "none") {
        r_.bad(
            fmt::format("{}.tool_choice: 'none' would make the tools pointless: leave 'tools' "
                        "out for a text answer{}",
                        where, Reader::at(choice)));
      }
      or_text = chosen == "auto";
      if (chosen != "required" && !or_text) {
        functions =
            checked(choice, [&] { return tool_named(functions, chosen, where + ".tool_choice"); });
      }
    }
    checked(list, [&] {
      call_tools(agent, std::move(functions), or_text);
      return 0;
    });
  }

  // {file: PATH} (relative to the pipeline file): the file's text; nullopt
  // for any other value.
  std::optional<std::string> file_form(const YAML::Node& n, const std::string& key) const {
    if (!n.IsMap() || n.size() != 1 || !n["file"]) return std::nullopt;
    auto file = std::filesystem::path(r_.text(n, "file", "", key));
    if (file.is_relative()) file = base_ / file;
    return read_file(file.string(), fmt::format("{}: {} file", origin_, key));
  }

  std::vector<std::string> stop(const YAML::Node& n, const std::string& where) const {
    std::vector<std::string> stop = r_.list(n, "stop", where);
    for (const std::string& s : stop) {
      if (s.empty()) {
        r_.bad(
            fmt::format("{}.stop holds an empty string, which would end every answer before "
                        "its first token{}",
                        where, Reader::at(n["stop"])));
      }
    }
    return stop;
  }

  DocumentNeeds needs(const YAML::Node& n, const std::string& where) const {
    if (!n.IsMap()) {
      r_.bad(fmt::format("{}.needs must be a mapping: {{tokens: N}} or {{until: \"text\"}}{}",
                         where, Reader::at(n)));
    }
    r_.check_keys(n, {"tokens", "until"}, where + ".needs");
    DocumentNeeds needs;
    needs.tokens = static_cast<int32_t>(r_.integer(n, "tokens", 0, 1, kMaxInt32, where + ".needs"));
    needs.until = r_.text(n, "until", "", where + ".needs");
    if (n["until"] && needs.until.empty())
      r_.bad(fmt::format("{}.needs.until is empty{}", where, Reader::at(n["until"])));
    return needs;
  }

  const Reader& r_;
  const std::filesystem::path base_;  // the pipeline file's folder
  const std::string origin_;
  std::set<std::string> sampling_keys_;
};

// A pipeline file's tree as a corpus (`corpus` true: `documents:` or
// `document:`, agents of either scope) or as one document's pipeline
// (CorpusSpec::pipeline; `documents:` and `scope: corpus` refused).
CorpusSpec parse(const YAML::Node& root, const std::string& origin, const std::string& base_dir,
                 const std::string& default_name, bool corpus) {
  const Reader r(origin);
  if (!root.IsMap()) r.bad("the top level must be a mapping");
  if (!corpus && root["documents"]) {
    r.bad(
        fmt::format("'documents' (a corpus){} runs under `swarmkv run` only; here give one "
                    "'document'",
                    Reader::at(root["documents"])));
  }
  std::set<std::string> keys = {"name",     "model",         "n_ctx",      "n_batch", "n_ubatch",
                                "threads",  "threads_batch", "flash_attn", "kv_type", "fork",
                                "exact",    "n_gpu_layers",  "max_live",   "system",  "document",
                                "defaults", "agents"};
  if (corpus) keys.insert("documents");
  r.check_keys(root, keys, "the pipeline");
  CorpusSpec out;
  PipelineSpec& spec = out.pipeline;
  const std::filesystem::path base(base_dir);
  read_settings(r, root, base, default_name, spec);
  if (root["documents"]) {
    if (root["document"]) r.bad("give either 'document' or 'documents', not both");
    out.documents = read_documents(r, root["documents"], base, origin);
    out.listed = true;
  } else {
    read_document(r, root, base, origin, spec);
    if (corpus) {
      DocumentRef doc;  // its text as read here: one document is not read twice
      if (spec.document_source.starts_with("file:")) {
        doc.path = spec.document_source.substr(5);
        doc.name = std::filesystem::path(doc.path).filename().string();
      } else {
        doc.name = "document";
      }
      doc.text = std::move(spec.document);
      out.documents.push_back(std::move(doc));
      spec.document.clear();
      spec.document_source.clear();
    }
  }
  const AgentReader agents_reader(r, base, origin);
  const AgentSpec defaults = agents_reader.defaults(root["defaults"]);
  const YAML::Node agents = root["agents"];
  if (!agents || !agents.IsSequence() || agents.size() == 0)
    r.bad("'agents' must be a non-empty list");
  for (size_t i = 0; i < agents.size(); ++i) {
    AgentSpec agent = agents_reader.agent(agents[i], i, defaults);
    const std::string where = fmt::format("agents[{}]", i);
    const std::string scope =
        agents[i].IsMap() ? r.text(agents[i], "scope", "document", where) : std::string("document");
    if (scope != "document" && scope != "corpus") {
      r.bad(
          fmt::format("{}.scope must be 'document' (once per document, the default) or "
                      "'corpus' (once over every document's answers), not '{}'{}",
                      where, scope, Reader::at(agents[i]["scope"])));
    }
    if (scope == "corpus" && !corpus) {
      r.bad(
          fmt::format("{} ('{}'): scope: corpus runs once over the answers of every document "
                      "of a corpus (`documents:` under `swarmkv run`); this pipeline has one "
                      "document",
                      where, agent.name));
    }
    (scope == "corpus" ? out.reduce : spec.agents).push_back(std::move(agent));
  }
  // What needs no model: names, graph, text; the file named in each message.
  try {
    if (corpus) {
      validate_corpus(out);
    } else {
      validate_pipeline(spec);
    }
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", origin, e.message()));
  }
  return out;
}

// The deepest a pipeline nests (the pipeline, agents, an agent, its stop
// list or needs, a value; a JSON schema nests a level or two per property),
// with room to spare: a deeper tree is refused before it is walked.
constexpr int kMaxJsonDepth = 32;

// A JSON value as the YAML tree the reader takes: scalars as their text
// (a number as JSON writes it, so that nothing is rounded on the way), keys
// in their order. No positions: the reader's messages name keys alone.
template <class Json>
YAML::Node yaml_tree(const Json& j, const Reader& r, int depth = 0) {
  if (depth > kMaxJsonDepth) r.bad(fmt::format("nested deeper than {} levels", kMaxJsonDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return YAML::Node(YAML::NodeType::Null);
    case nlohmann::json::value_t::string: {
      YAML::Node out(j.template get_ref<const std::string&>());
      out.SetTag("!");  // a string, as a quoted YAML scalar is (json_value reads it so)
      return out;
    }
    case nlohmann::json::value_t::array: {
      YAML::Node out(YAML::NodeType::Sequence);
      for (const Json& v : j) out.push_back(yaml_tree(v, r, depth + 1));
      return out;
    }
    case nlohmann::json::value_t::object: {
      YAML::Node out(YAML::NodeType::Map);
      // force_insert: no look-up per key (a JSON object's keys are unique).
      for (const auto& [key, v] : j.items()) out.force_insert(key, yaml_tree(v, r, depth + 1));
      return out;
    }
    default:  // booleans and numbers
      return YAML::Node(j.dump());
  }
}

// A plain YAML value cannot start with '{{' (it opens a mapping): the usual
// cause of a parse error in a file with placeholders.
std::string yaml_error(const std::string& origin, const std::string& text,
                       const YAML::Exception& e) {
  const bool placeholder = text.find(": {{") != std::string::npos;
  return fmt::format("{}: not valid YAML: {}{}", origin, e.what(),
                     placeholder ? " (a value that starts with '{{' must be quoted: prompt: "
                                   "\"{{name}} ...\")"
                                 : "");
}

CorpusSpec parse_text(const std::string& text, const std::string& origin,
                      const std::string& base_dir, const std::string& default_name,
                      bool corpus = false) {
  try {
    return parse(YAML::Load(text), origin, base_dir, default_name, corpus);
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCode::kInvalidArgument, yaml_error(origin, text, e));
  }
}

template <class Json>
CorpusSpec parse_json(const Json& pipeline, const std::string& origin, const std::string& base_dir,
                      const std::string& default_name, bool corpus = false) {
  return parse(yaml_tree(pipeline, Reader(origin)), origin, base_dir, default_name, corpus);
}

// What JSON allows and a pipeline does not, found before a tree is built:
// a key given twice in one object (nlohmann keeps the last, silently, where
// the YAML reader refuses it) and nesting deeper than a pipeline's.
class JsonShapeCheck final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit JsonShapeCheck(const std::string& origin) : origin_(origin) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open(true);
    return true;
  }
  bool key(string_t& key) override {
    if (!keys_.back().insert(key).second) {
      refuse(fmt::format("key '{}' is given twice in one object", key));
    }
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(std::size_t) override {
    open(false);
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  // The tree's parse names it.
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }

 private:
  void open(bool object) {
    if (++depth_ > kMaxJsonDepth)
      refuse(fmt::format("nested deeper than {} levels", kMaxJsonDepth));
    if (object) keys_.emplace_back();
  }
  [[noreturn]] void refuse(const std::string& what) const {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: not JSON ({})", origin_, what));
  }
  const std::string& origin_;
  int depth_ = 0;
  std::vector<std::set<std::string>> keys_;  // per open object, the keys seen so far
};

bool is_json_file(const std::string& path) {
  std::string ext = std::filesystem::path(path).extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return ext == ".json";
}

}  // namespace

PipelineSpec parse_pipeline(const std::string& yaml, const std::string& origin,
                            const std::string& base_dir) {
  return parse_text(yaml, origin, base_dir, "pipeline").pipeline;
}

nlohmann::ordered_json read_pipeline_json(std::string_view text, const std::string& origin) {
  // A first pass that builds nothing (nlohmann's parser callback would do
  // it in one, but rescans an array at each of its objects' ends), then the
  // tree; syntax errors are the second pass's.
  JsonShapeCheck shape(origin);
  nlohmann::json::sax_parse(text, &shape);
  try {
    return nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: not JSON ({})", origin, e.what()));
  }
}

PipelineSpec parse_pipeline_json(const nlohmann::json& pipeline, const std::string& origin,
                                 const std::string& base_dir) {
  return parse_json(pipeline, origin, base_dir, "pipeline").pipeline;
}

PipelineSpec parse_pipeline_json(const nlohmann::ordered_json& pipeline, const std::string& origin,
                                 const std::string& base_dir) {
  return parse_json(pipeline, origin, base_dir, "pipeline").pipeline;
}

CorpusSpec parse_corpus_json(const nlohmann::ordered_json& pipeline, const std::string& origin,
                             const std::string& base_dir) {
  return parse_json(pipeline, origin, base_dir, "pipeline", /*corpus=*/true);
}

nlohmann::json needs_json(const DocumentNeeds& needs) {
  if (!needs.any()) return nullptr;
  nlohmann::json j = nlohmann::json::object();
  if (needs.tokens > 0) j["tokens"] = needs.tokens;
  if (!needs.until.empty()) j["until"] = needs.until;
  return j;
}

nlohmann::json pipeline_json(const PipelineSpec& spec) {
  nlohmann::json agents = nlohmann::json::array();
  for (const AgentSpec& a : spec.agents) {
    nlohmann::json agent = {
        {"name", a.name}, {"prompt", a.prompt},         {"max_tokens", a.max_tokens},
        {"stop", a.stop}, {"depends_on", a.depends_on}, {"priority", a.priority}};
    for_each_sampling_field(
        a.sampling, [&](const char* key, const auto& value, int64_t) { agent[key] = value; });
    if (!a.tools.empty()) {
      // As text, as json_schema below: the parameters keep their order.
      agent["tools"] = tools_json(a.tools).dump();
      if (a.tool_or_text) agent["tool_choice"] = "auto";
    } else if (!a.json_schema.empty()) {
      // As text: a JSON object here would sort the schema's keys, and its
      // properties are generated in their order.
      agent["json_schema"] = a.json_schema;
    } else if (!a.sampling.grammar.empty()) {
      agent["grammar"] = a.sampling.grammar;
    }
    if (!a.sampling.logit_bias.empty()) {
      nlohmann::json biases = nlohmann::json::object();
      for (const auto& [token, bias] : a.sampling.logit_bias) biases[std::to_string(token)] = bias;
      agent["logit_bias"] = std::move(biases);
    }
    if (!a.fork_from.empty()) agent["fork_from"] = a.fork_from;
    if (a.needs.any()) agent["needs"] = needs_json(a.needs);
    agents.push_back(std::move(agent));
  }
  nlohmann::json j = {{"name", spec.name},
                      {"system", spec.system_prompt},
                      {"document", {{"text", spec.document}}},
                      {"n_ctx", spec.n_ctx},
                      {"n_batch", spec.n_batch},
                      {"n_ubatch", spec.n_ubatch},
                      {"threads", spec.n_threads},
                      {"threads_batch", spec.n_threads_batch},
                      {"flash_attn", spec.flash_attn},
                      {"fork", std::string(to_string(spec.fork))},
                      {"exact", spec.exact},
                      {"n_gpu_layers", spec.n_gpu_layers},
                      {"max_live", spec.max_live},
                      {"agents", std::move(agents)}};
  if (!spec.model.empty()) j["model"] = spec.model;
  if (spec.kv_type) j["kv_type"] = std::string(to_string(*spec.kv_type));
  return j;
}

namespace {

CorpusSpec load(const std::string& path, bool corpus) {
  const std::string text = read_file(path, "pipeline file");
  const std::string base_dir = std::filesystem::path(path).parent_path().string();
  const std::string name = std::filesystem::path(path).stem().string();
  if (is_json_file(path))
    return parse_json(read_pipeline_json(text, path), path, base_dir, name, corpus);
  return parse_text(text, path, base_dir, name, corpus);
}

}  // namespace

PipelineSpec load_pipeline_file(const std::string& path) {
  return load(path, false).pipeline;
}

CorpusSpec load_corpus_file(const std::string& path) {
  return load(path, true);
}

}  // namespace swarmkv
