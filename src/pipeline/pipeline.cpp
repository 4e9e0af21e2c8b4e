// The runner: validate, tokenise, budget, then hand the run to the fork
// strategy of spec.fork and stitch the DAG's outcomes into the result.
#include "swarmkv/pipeline.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pipeline/dag.h"
#include "pipeline/fork_strategy.h"
#include "prefix/prefix_source.h"
#include "swarmkv/chat.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace {

constexpr std::string_view kDocumentNode = "document";
// Splits the rendered chat template at the agent's prompt. Chosen so that no
// real document or prompt contains it.
constexpr std::string_view kPromptMarker = "\x1f<swarmkv-agent-prompt>\x1f";

// Node 0 is the document, node i + 1 agent i; every agent depends on the
// document and on its depends_on.
std::vector<detail::DagNode> dag_nodes(const PipelineSpec& spec) {
  std::vector<detail::DagNode> nodes{{std::string(kDocumentNode), {}}};
  for (const AgentSpec& a : spec.agents) {
    detail::DagNode node{a.name, {std::string(kDocumentNode)}};
    node.depends_on.insert(node.depends_on.end(), a.depends_on.begin(), a.depends_on.end());
    if (!a.fork_from.empty() &&
        std::find(a.depends_on.begin(), a.depends_on.end(), a.fork_from) == a.depends_on.end())
      node.depends_on.push_back(a.fork_from);
    nodes.push_back(std::move(node));
  }
  return nodes;
}

// Each agent's index by name, the first of a repeated name as agent_index
// gives it: a look-up per reference instead of a scan of the agents.
std::unordered_map<std::string_view, size_t> agent_indices(const PipelineSpec& spec) {
  std::unordered_map<std::string_view, size_t> out;
  out.reserve(spec.agents.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) out.emplace(spec.agents[i].name, i);
  return out;
}

// The document is text with something in it; so is the system prompt.
void validate_document(const PipelineSpec& spec) {
  if (spec.no_document) {
    if (!spec.document.empty())
      throw Error(ErrorCode::kInvalidArgument, "a pipeline without a document has document text");
    require_text(spec.system_prompt, "the system prompt");
    return;
  }
  const std::string what = spec.document_source.empty()
                               ? std::string("the document")
                               : fmt::format("the document ({})", spec.document_source);
  if (spec.document.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                spec.document_source.empty()
                    ? std::string("the document is empty")
                    : fmt::format("the document is empty ({})", spec.document_source));
  }
  require_text(spec.document, what);
  require_text(spec.system_prompt, "the system prompt");
}

// Where the chat template puts the system prompt, the document and the
// agent's prompt; chosen so that no real text contains them.
constexpr std::string_view kSystemMarker = "\x1f<swarmkv-system>\x1f";
constexpr std::string_view kDocumentMarker = "\x1f<swarmkv-document>\x1f";
// A parent agent's answer and its child's prompt (fork_from).
constexpr std::string_view kAnswerMarker = "\x1f<swarmkv-answer>\x1f";
constexpr std::string_view kNextPromptMarker = "\x1f<swarmkv-next-prompt>\x1f";

// The rendered chat, cut where the agent's prompt goes. Each part is a list
// of pieces: the template's markup (its control-token texts become control
// tokens) and content (the system prompt, the document: always plain text).
struct TemplateSplit {
  std::vector<std::string> texts;      // the rendered head and tail the pieces view
  std::string turn_close;              // after an answer, before the next user turn's text
  size_t document_piece = 0;           // head[document_piece] is the document
  std::vector<Model::TextPiece> head;  // the shared prefix
  std::vector<Model::TextPiece> tail;  // what closes every agent prompt (markup)
};

// Renders the chat once with markers for the system prompt, the document and
// the agent's prompt: what comes before the prompt is the shared prefix, what
// follows closes every branch.
TemplateSplit split_template(const PipelineSpec& spec, const Model& model) {
  const bool trees = spec.any_fork_from();
  std::vector<ChatMessage> chat;
  if (!spec.system_prompt.empty()) chat.push_back({"system", std::string(kSystemMarker)});
  chat.push_back({"user", spec.no_document ? std::string(kPromptMarker)
                                           : std::string(kDocumentMarker) + "\n\n" +
                                                 std::string(kPromptMarker)});
  const std::string rendered = render_chat(model, chat, /*add_assistant=*/true);
  std::string continued;
  if (trees) {
    chat.push_back({"assistant", std::string(kAnswerMarker)});
    chat.push_back({"user", std::string(kNextPromptMarker)});
    continued = render_chat(model, chat, /*add_assistant=*/true);
  }
  const size_t at = rendered.find(kPromptMarker);
  if (at == std::string::npos || (!spec.no_document && rendered.find(kDocumentMarker) > at)) {
    throw Error(ErrorCode::kChatTemplate,
                "the chat template dropped the document or the agent prompt; cannot split the "
                "prefix");
  }
  TemplateSplit out;
  out.texts = {rendered.substr(0, at), rendered.substr(at + kPromptMarker.size())};
  const Model::Placeholder contents[] = {{kSystemMarker, spec.system_prompt},
                                         {kDocumentMarker, spec.document}};
  out.head = Model::fill_placeholders(out.texts[0], contents);
  out.tail = Model::fill_placeholders(out.texts[1], {});
  for (size_t i = 0; i < out.head.size(); ++i) {
    if (!out.head[i].markup && out.head[i].text.data() == spec.document.data())
      out.document_piece = i;
  }
  if (trees) {
    // A child continues its parent's conversation: the two-turn chat must
    // render the first turn as the one-turn chat does, and close the second
    // the same way.
    const size_t answer = continued.find(kAnswerMarker);
    const size_t next = continued.find(kNextPromptMarker);
    if (answer == std::string::npos || next == std::string::npos || next < answer ||
        continued.compare(0, answer, rendered) != 0 ||
        continued.substr(next + kNextPromptMarker.size()) != out.texts[1]) {
      throw Error(ErrorCode::kChatTemplate,
                  "the chat template does not continue a conversation turn by turn; fork_from "
                  "cannot extend an agent's answer with this model");
    }
    out.turn_close =
        continued.substr(answer + kAnswerMarker.size(), next - answer - kAnswerMarker.size());
  }
  return out;
}

// Strict UTF-8: no overlong forms, surrogates or code points past U+10FFFF.
bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3, cp = c & 0x07;
    } else {
      return false;
    }
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return false;
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

// Where the document's tokens lie in the prefix, and each agent's
// watermark. The head is tokenised up to the document and through it: the
// tokens both share with the whole prefix are the document's own (a token
// that merges the document's end with the markup after it is not one).
void locate_document(const PipelineSpec& spec, const Model& model, const TemplateSplit& split,
                     PreparedPipeline& out) {
  if (!spec.any_needs()) {
    out.watermarks.assign(spec.agents.size(), static_cast<int32_t>(out.prefix.size()));
    return;  // nothing to cut: spare tokenising the document twice more
  }
  const auto upto = [&](std::string_view document_part) {
    std::vector<Model::TextPiece> pieces(
        split.head.begin(), split.head.begin() + static_cast<std::ptrdiff_t>(split.document_piece));
    if (!document_part.empty()) pieces.push_back({document_part, false});
    return model.tokenize(pieces, /*add_special=*/true);
  };
  const std::vector<Token> before = upto({});
  const size_t begin = common_prefix(before, out.prefix);
  const size_t through = common_prefix(upto(spec.document), out.prefix);
  out.document_begin = static_cast<int32_t>(begin);
  out.document_tokens = static_cast<int32_t>(through > begin ? through - begin : 0);
  std::vector<Model::TextPiece> after(
      split.head.begin() + static_cast<std::ptrdiff_t>(split.document_piece) + 1, split.head.end());
  out.doc_close = model.tokenize(after, /*add_special=*/false);
  for (const AgentSpec& a : spec.agents) {
    if (!a.needs.any()) {
      out.watermarks.push_back(static_cast<int32_t>(out.prefix.size()));
      continue;
    }
    size_t n = static_cast<size_t>(a.needs.tokens);
    if (!a.needs.until.empty()) {
      const size_t end = spec.document.find(a.needs.until) + a.needs.until.size();
      const std::vector<Token> cut = upto(std::string_view(spec.document).substr(0, end));
      const size_t common = common_prefix(cut, out.prefix);
      // A marker whose last token merges with what follows: include that token.
      n = (common == cut.size() ? common : common + 1) - begin;
    }
    if (n > static_cast<size_t>(out.document_tokens)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}' needs {} document tokens, but the document has {}",
                              a.name, n, out.document_tokens));
    }
    out.watermarks.push_back(static_cast<int32_t>(begin + n));
  }
}

}  // namespace

std::optional<size_t> PipelineSpec::agent_index(std::string_view agent) const {
  const auto it = std::find_if(agents.begin(), agents.end(),
                               [&](const AgentSpec& a) { return a.name == agent; });
  if (it == agents.end()) return std::nullopt;
  return static_cast<size_t>(it - agents.begin());
}

bool PipelineSpec::any_needs() const {
  return std::any_of(agents.begin(), agents.end(),
                     [](const AgentSpec& a) { return a.needs.any(); });
}

bool PipelineSpec::any_fork_from() const {
  return std::any_of(agents.begin(), agents.end(),
                     [](const AgentSpec& a) { return !a.fork_from.empty(); });
}

std::string_view to_string(ForkMode mode) noexcept {
  switch (mode) {
    case ForkMode::kShared:
      return "shared";
    case ForkMode::kHost:
      return "host";
    case ForkMode::kNone:
      return "none";
  }
  return "unknown";
}

ForkMode parse_fork_mode(std::string_view name) {
  if (name == "shared") return ForkMode::kShared;
  if (name == "host") return ForkMode::kHost;
  if (name == "none") return ForkMode::kNone;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown fork mode '{}' (expected shared, host or none)", name));
}

std::string_view to_string(GuardPolicy policy) noexcept {
  return policy == GuardPolicy::kSerialized ? "serialized" : "concurrent";
}

GuardPolicy parse_guard_policy(std::string_view name) {
  if (name == "serialized") return GuardPolicy::kSerialized;
  if (name == "concurrent") return GuardPolicy::kConcurrent;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown guard policy '{}' (expected serialized or concurrent)", name));
}

std::string_view to_string(NodeStatus status) noexcept {
  switch (status) {
    case NodeStatus::kOk:
      return "ok";
    case NodeStatus::kFailed:
      return "failed";
    case NodeStatus::kDependencyFailed:
      return "dependency_failed";
  }
  return "unknown";
}

bool PipelineResult::ok() const noexcept {
  return document_status == NodeStatus::kOk &&
         std::all_of(agents.begin(), agents.end(),
                     [](const AgentResult& a) { return a.status == NodeStatus::kOk; });
}

namespace {

// One agent's own fields: name, prompt, max_tokens, stop strings, sampling.
void validate_agent(const AgentSpec& a, size_t i) {
  if (a.name.empty()) throw Error(ErrorCode::kInvalidArgument, "an agent has an empty name");
  if (!valid_utf8(a.name) ||
      a.name.find_first_of(std::string_view("\0\n\r\t", 4)) != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the name of agents[{}] is not valid UTF-8 text on one line", i));
  }
  if (a.name == kDocumentNode) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("agent name '{}' is reserved for the document node", a.name));
  }
  if (a.prompt.empty())
    throw Error(ErrorCode::kInvalidArgument, fmt::format("agent '{}' has an empty prompt", a.name));
  require_text(a.prompt, fmt::format("agent '{}': the prompt", a.name));
  if (a.max_tokens < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("agent '{}': max_tokens must be >= 1 (got {})", a.name, a.max_tokens));
  }
  if (!a.tools.empty() && (a.json_schema != tool_call_schema(a.tools, a.tool_or_text) ||
                           a.sampling.grammar != grammar_from_json_schema(a.json_schema))) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("agent '{}': its json_schema and grammar are not those of a call of "
                            "its tools (set them with call_tools)",
                            a.name));
  }
  if (!a.sampling.grammar.empty() && !a.stop.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("agent '{}': stop strings and a {} do not mix (a stop string would "
                            "cut the structure; the grammar ends the answer)",
                            a.name, a.json_schema.empty() ? "grammar" : "json_schema"));
  }
  for (const std::string& stop : a.stop) {
    if (stop.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': a stop string is empty (it would end every answer "
                              "before its first token)",
                              a.name));
    }
  }
  try {
    validate_sampling(a.sampling);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("agent '{}': {}", a.name, e.value().message));
  }
}

using IndexOf = std::function<std::optional<size_t>(std::string_view)>;

// needs (tokens or until, in the document) and fork_from (a known agent
// that reads the whole document, not itself).
void validate_needs_and_forks(const PipelineSpec& spec, const IndexOf& index_of) {
  for (const AgentSpec& a : spec.agents) {
    if (a.needs.tokens < 0) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("agent '{}': needs.tokens must be >= 1 (got {})", a.name, a.needs.tokens));
    }
    if (a.needs.tokens > 0 && !a.needs.until.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': needs takes 'tokens' or 'until', not both", a.name));
    }
    if (a.needs.any() && spec.no_document) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': needs reads part of the document, and this pipeline "
                              "has none (a corpus's reduce agent)",
                              a.name));
    }
    if (!a.needs.until.empty() && spec.document.find(a.needs.until) == std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': needs.until: '{}' is not in the document", a.name,
                              a.needs.until));
    }
    if (a.needs.any() && !a.fork_from.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': needs and fork_from do not combine (a child reads its "
                              "parent's whole conversation)",
                              a.name));
    }
    if (a.fork_from.empty()) continue;
    const std::optional<size_t> parent = index_of(a.fork_from);
    if (parent && spec.agents[*parent].needs.any()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}': fork_from names '{}', which reads only part of the "
                              "document (needs); fork from an agent that reads all of it",
                              a.name, a.fork_from));
    }
    if (a.fork_from == a.name) {
      throw Error(ErrorCode::kGraph, fmt::format("agent '{}' cannot fork from itself", a.name));
    }
    if (!parent) {
      throw Error(ErrorCode::kGraph, fmt::format("agent '{}': fork_from names unknown agent '{}'",
                                                 a.name, a.fork_from));
    }
  }
}

// A placeholder's field path (".a[0].b") as a JSON pointer ("/a/0/b").
nlohmann::json::json_pointer field_pointer(std::string_view field) {
  std::string pointer;
  size_t at = 0;
  while (at < field.size()) {
    if (field[at] == '.') {
      const size_t end = field.find_first_of(".[", at + 1);
      const std::string_view key = field.substr(at + 1, end - at - 1);
      if (key.empty()) break;
      pointer += '/';
      for (const char c : key) pointer += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      at = end == std::string_view::npos ? field.size() : end;
    } else if (field[at] == '[') {
      const size_t end = field.find(']', at);
      const std::string_view index =
          end == std::string_view::npos ? std::string_view() : field.substr(at + 1, end - at - 1);
      if (index.empty() || index.find_first_not_of("0123456789") != std::string_view::npos) break;
      pointer += '/';
      pointer += index;
      at = end + 1;
    } else {
      break;
    }
  }
  if (at != field.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the field '{}' is not a path of .names and [indices]", field));
  }
  return nlohmann::json::json_pointer(pointer);
}

// Whether `schema` (a JSON Schema) may hold `field`: a name must be among
// an object's declared properties, an index needs an array; where the
// schema does not say (no properties, anyOf, $ref), it may.
std::optional<std::string> field_outside_schema(const nlohmann::json& schema,
                                                nlohmann::json::json_pointer field) {
  std::vector<std::string> steps;
  for (; !field.empty(); field.pop_back()) steps.insert(steps.begin(), field.back());
  const nlohmann::json* at = &schema;
  for (const std::string& step : steps) {
    if (!at->is_object()) return std::nullopt;
    if (const auto props = at->find("properties"); props != at->end() && props->is_object()) {
      const auto it = props->find(step);
      if (it == props->end()) return fmt::format("'{}' is not among its schema's properties", step);
      at = &*it;
    } else if (const auto items = at->find("items"); items != at->end()) {
      if (step.find_first_not_of("0123456789") != std::string::npos)
        return fmt::format("'{}' names a property of a list", step);
      at = &*items;
    } else {
      return std::nullopt;
    }
  }
  return std::nullopt;
}

// A placeholder's field: of an agent whose answer is JSON (a json_schema),
// and where its schema says which fields there are, one of them.
void validate_field(const AgentSpec& upstream, const AgentSpec& agent, const std::string& text,
                    const PlaceholderRef& ref) {
  if (upstream.json_schema.empty()) {
    throw Error(ErrorCode::kGraph,
                fmt::format("agent '{}': placeholder {{{{{}}}}} takes a field of the answer of "
                            "'{}', which has no json_schema (its answer is text)",
                            agent.name, text, ref.agent));
  }
  const nlohmann::json schema = nlohmann::json::parse(upstream.json_schema);
  if (const std::optional<std::string> outside =
          field_outside_schema(schema, field_pointer(ref.field))) {
    throw Error(ErrorCode::kGraph, fmt::format("agent '{}': placeholder {{{{{}}}}}: {} ('{}')",
                                               agent.name, text, *outside, ref.agent));
  }
}

// Every placeholder names an agent among its dependencies.
void validate_placeholders(const PipelineSpec& spec, const IndexOf& index_of) {
  const std::vector<std::vector<size_t>> deps = detail::resolve_dag(dag_nodes(spec));
  detail::Ancestry ancestry(deps);
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    for (const PromptPlaceholder& h : prompt_placeholders(spec.agents[i].prompt)) {
      if (spec.inputs.contains(h.name)) continue;  // given by the caller
      std::optional<PlaceholderRef> ref;
      try {
        ref = resolve_placeholder(
            h.name, [&](std::string_view name) { return index_of(name).has_value(); });
      } catch (const Error& e) {
        throw Error(ErrorCode::kGraph, fmt::format("agent '{}': placeholder {{{{{}}}}}: {}",
                                                   spec.agents[i].name, h.name, e.message()));
      }
      const std::optional<size_t> named = ref ? index_of(ref->agent) : std::nullopt;
      if (!named) {
        throw Error(ErrorCode::kGraph,
                    fmt::format("agent '{}': placeholder {{{{{}}}}} names unknown agent '{}'",
                                spec.agents[i].name, h.name, h.name));
      }
      if (!ancestry.depends_on(i + 1, *named + 1)) {
        throw Error(ErrorCode::kGraph,
                    fmt::format("agent '{}': placeholder {{{{{}}}}} names agent '{}', which is not "
                                "among its dependencies (add '{}' to depends_on)",
                                spec.agents[i].name, h.name, ref->agent, ref->agent));
      }
      if (!ref->field.empty()) validate_field(spec.agents[*named], spec.agents[i], h.name, *ref);
    }
  }
}

}  // namespace

void validate_pipeline(const PipelineSpec& spec) {
  validate_document(spec);
  spec.validate();
  if (spec.agents.empty()) throw Error(ErrorCode::kInvalidArgument, "the pipeline has no agents");
  for (size_t i = 0; i < spec.agents.size(); ++i) validate_agent(spec.agents[i], i);
  if (spec.max_live < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("max_live must be >= 0 (0: as many as fit; got {})", spec.max_live));
  }
  const std::unordered_map<std::string_view, size_t> index = agent_indices(spec);
  const IndexOf index_of = [&](std::string_view name) -> std::optional<size_t> {
    const auto it = index.find(name);
    return it == index.end() ? std::nullopt : std::optional<size_t>(it->second);
  };
  validate_needs_and_forks(spec, index_of);
  validate_placeholders(spec, index_of);
}

std::vector<PromptPlaceholder> prompt_placeholders(std::string_view prompt) {
  std::vector<PromptPlaceholder> out;
  for (size_t at = prompt.find("{{"); at != std::string_view::npos; at = prompt.find("{{", at)) {
    const size_t close = prompt.find("}}", at + 2);
    if (close == std::string_view::npos) break;
    std::string_view name = prompt.substr(at + 2, close - at - 2);
    while (!name.empty() && name.front() == ' ') name.remove_prefix(1);
    while (!name.empty() && name.back() == ' ') name.remove_suffix(1);
    out.push_back({std::string(name), at, close + 2});
    at = close + 2;
  }
  return out;
}

std::optional<PlaceholderRef> resolve_placeholder(const PipelineSpec& spec, std::string_view text) {
  return resolve_placeholder(
      text, [&](std::string_view name) { return spec.agent_index(name).has_value(); });
}

std::optional<PlaceholderRef> resolve_placeholder(
    std::string_view text, const std::function<bool(std::string_view)>& is_agent) {
  if (is_agent(text)) return PlaceholderRef{std::string(text), {}};
  const size_t split = text.find_first_of(".[");
  if (split == std::string_view::npos || split == 0) return std::nullopt;
  const std::string_view agent = text.substr(0, split);
  if (!is_agent(agent)) return std::nullopt;
  PlaceholderRef ref{std::string(agent), std::string(text.substr(split))};
  (void)field_pointer(ref.field);  // a path that does not parse is refused here
  return ref;
}

std::string placeholder_value(const PlaceholderRef& ref, const std::string& answer) {
  if (ref.field.empty()) return answer;
  const nlohmann::json value = nlohmann::json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{{{{{}{}}}}}: the answer of '{}' is not JSON", ref.agent, ref.field,
                            ref.agent));
  }
  const nlohmann::json::json_pointer pointer = field_pointer(ref.field);
  if (!value.contains(pointer)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{{{{{}{}}}}}: the answer of '{}' has no such field: {}", ref.agent,
                            ref.field, ref.agent, answer));
  }
  const nlohmann::json& field = value.at(pointer);
  return field.is_string() ? field.get<std::string>() : field.dump();
}

std::map<std::string, std::string> placeholder_values(
    const PipelineSpec& spec, std::string_view prompt,
    const std::function<const std::string&(size_t agent)>& answer_of) {
  std::map<std::string, std::string> values;
  for (const PromptPlaceholder& h : prompt_placeholders(prompt)) {
    if (const auto input = spec.inputs.find(h.name); input != spec.inputs.end()) {
      values[h.name] = input->second;
      continue;
    }
    const std::optional<PlaceholderRef> ref = resolve_placeholder(spec, h.name);
    if (!ref) {
      throw Error(ErrorCode::kGraph, fmt::format("placeholder {{{{{}}}}} names no agent", h.name));
    }
    values[h.name] = placeholder_value(*ref, answer_of(*spec.agent_index(ref->agent)));
  }
  return values;
}

bool renders_at_start(const AgentSpec& agent) {
  return !agent.fork_from.empty() || !prompt_placeholders(agent.prompt).empty();
}

std::string render_prompt(std::string_view prompt,
                          const std::map<std::string, std::string>& answers) {
  std::string out;
  size_t from = 0;
  for (const PromptPlaceholder& h : prompt_placeholders(prompt)) {
    out.append(prompt.substr(from, h.begin - from));
    out.append(answers.at(h.name));
    from = h.end;
  }
  out.append(prompt.substr(from));
  return out;
}

void call_tools(AgentSpec& agent, std::vector<ToolFunction> tools, bool or_text) {
  if (tools.empty()) throw Error(ErrorCode::kInvalidArgument, "call_tools: no tools");
  agent.tools = std::move(tools);
  agent.tool_or_text = or_text;
  agent.json_schema = tool_call_schema(agent.tools, or_text);
  agent.sampling.grammar = grammar_from_json_schema(agent.json_schema);
}

std::string agent_turn(const AgentSpec& agent, const std::map<std::string, std::string>& answers) {
  std::string turn = render_prompt(agent.prompt, answers);
  if (!agent.tools.empty()) turn += "\n\n" + tools_prompt(agent.tools, agent.tool_or_text);
  return turn;
}

Percentiles percentiles(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  const auto at = [&](double q) {
    const double rank = q * static_cast<double>(values.size() - 1);
    const auto lo = static_cast<size_t>(rank);
    const size_t hi = std::min(lo + 1, values.size() - 1);
    return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
  };
  return {at(0.50), at(0.95), at(0.99)};
}

LatencySummary latency_summary(const PipelineResult& result) {
  std::vector<double> queue, ttft, gaps, completion;
  for (const AgentResult& a : result.agents) {
    if (a.status != NodeStatus::kOk) continue;
    queue.push_back(a.timings_ms.wait);
    ttft.push_back(a.timings_ms.first_token_at);
    completion.push_back(a.timings_ms.done_at);
    for (size_t k = 1; k < a.token_at_ms.size(); ++k)
      gaps.push_back(a.token_at_ms[k] - a.token_at_ms[k - 1]);
  }
  LatencySummary out;
  out.agents = queue.size();
  out.queue = percentiles(std::move(queue));
  out.ttft = percentiles(std::move(ttft));
  out.inter_token = percentiles(std::move(gaps));
  out.completion = percentiles(std::move(completion));
  return out;
}

const PipelineSpec& exact_settled(const PipelineSpec& spec, const Model& model,
                                  std::optional<PipelineSpec>& storage) {
  const EngineSettings settled = spec.settle_exact(model);
  if (settled == spec) return spec;
  PipelineSpec& out = storage.emplace(spec);
  static_cast<EngineSettings&>(out) = settled;
  return out;
}

PipelineBudget plan_budget(ForkMode fork, int32_t prefix_tokens,
                           const std::vector<int32_t>& prompt_tokens,
                           const std::vector<int32_t>& max_tokens, uint32_t n_ctx) {
  return detail::make_fork_strategy(fork, GuardPolicy::kSerialized)
      ->budget(prefix_tokens, prompt_tokens, max_tokens, n_ctx);
}

std::vector<Token> prepare_prefix(const PipelineSpec& spec, const Model& model) {
  validate_document(spec);
  return model.tokenize(split_template(spec, model).head, /*add_special=*/true);
}

namespace {

// What each agent's prompt costs before its branch is known: tokenised now
// (into out.branches unless it renders at start), or, with placeholders,
// counted as the prompt without them plus each named agent's max_tokens.
std::vector<int64_t> own_prompt_tokens(const PipelineSpec& spec, const Model& model,
                                       const std::unordered_map<std::string_view, size_t>& index,
                                       PreparedPipeline& out) {
  std::vector<int64_t> own;
  for (const AgentSpec& a : spec.agents) {
    std::map<std::string, std::string> empty;
    int64_t answers = 0;
    for (const PromptPlaceholder& h : prompt_placeholders(a.prompt)) {
      if (const auto input = spec.inputs.find(h.name); input != spec.inputs.end()) {
        empty[h.name] = input->second;  // known: counted in the prompt as it will be
        continue;
      }
      empty[h.name];
      // validated: an agent's answer or a field of it (no longer than the answer)
      const auto ref =
          resolve_placeholder(h.name, [&](std::string_view name) { return index.contains(name); });
      answers += spec.agents[index.at(ref->agent)].max_tokens;
    }
    std::vector<Token> tokens = detail::tokenize_branch(model, out, agent_turn(a, empty));
    if (a.needs.any()) tokens.insert(tokens.begin(), out.doc_close.begin(), out.doc_close.end());
    own.push_back(static_cast<int64_t>(tokens.size()) + answers);
    out.branches.push_back(renders_at_start(a) ? std::vector<Token>{} : std::move(tokens));
  }
  return own;
}

// out.budgeted_prompt_tokens: a child's branch holds its ancestors'
// prompts, answers and turn closes before its own prompt (the DAG is
// acyclic: the recursion ends). Returns the cells each branch adds to its
// parent's (what a shared context holds).
std::vector<int32_t> budget_branches(const PipelineSpec& spec, const Model& model,
                                     const std::unordered_map<std::string_view, size_t>& index,
                                     const std::vector<int64_t>& own, PreparedPipeline& out) {
  const auto close = static_cast<int64_t>(
      out.turn_close.empty() ? 0 : model.tokenize(out.turn_close, false, true).size());
  const auto parent = [&](size_t i) { return index.at(spec.agents[i].fork_from); };
  std::vector<int64_t> full(spec.agents.size(), -1);
  const std::function<int64_t(size_t)> full_of = [&](size_t i) -> int64_t {
    if (full[i] >= 0) return full[i];
    int64_t n = own[i];
    if (!spec.agents[i].fork_from.empty()) {
      const size_t p = parent(i);
      n += full_of(p) + spec.agents[p].max_tokens + close;
    }
    return full[i] = n;
  };
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  std::vector<int32_t> new_cells;
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    out.budgeted_prompt_tokens.push_back(static_cast<int32_t>(std::min(full_of(i), kMax)));
    int64_t cells = full[i];
    if (!spec.agents[i].fork_from.empty()) {
      const size_t p = parent(i);
      cells -= full[p] + spec.agents[p].max_tokens - 1;  // its parent's last token may be undecoded
    }
    new_cells.push_back(static_cast<int32_t>(std::min(cells, kMax)));
  }
  return new_cells;
}

// fork_from under a shared fork: one sequence id per agent, all at once.
void check_tree_ids(const PipelineSpec& spec) {
  // exact: one more id parks finished branches' cells.
  const size_t ids = max_parallel_sequences() - (spec.exact ? 1 : 0);
  if (spec.any_fork_from() && fork_traits(spec.fork).one_context && spec.agents.size() + 1 > ids) {
    throw Error(ErrorCode::kBudget,
                fmt::format("fork_from under fork shared keeps a finished parent's sequence until "
                            "its children have forked: at most {} agents (one sequence id each), "
                            "got {}; use fork host or fewer agents",
                            ids - 1, spec.agents.size()));
  }
}

// Each sequence's positions against what the model was trained on; the
// cells of all sequences together are bounded by memory (check_memory).
void check_positions(const PipelineSpec& spec, const Model& model, const PreparedPipeline& out) {
  const int32_t train = model.n_ctx_train();
  if (train <= 0) return;
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    const int32_t prompt = out.budgeted_prompt_tokens[i];
    const int32_t max_tokens = spec.agents[i].max_tokens;
    const int64_t positions = static_cast<int64_t>(out.prefix.size()) + prompt + max_tokens;
    if (positions > train) {
      throw Error(ErrorCode::kBudget,
                  fmt::format("agent '{}' needs {} positions: prefix_tokens {} + prompt_tokens "
                              "{} + max_tokens {} > n_ctx_train {}, the context the model was "
                              "trained on; shorten the document or lower max_tokens",
                              spec.agents[i].name, positions, out.prefix.size(), prompt, max_tokens,
                              train));
    }
  }
}

// What needs the model: each distinct grammar parses for its vocabulary (a
// schema's was made by the converter when the pipeline was read; a
// `grammar:` is text), and each logit_bias id is in it.
void check_against_model(const PipelineSpec& spec, const Model& model) {
  std::set<std::string_view> checked;
  for (const AgentSpec& a : spec.agents) {
    try {
      if (!a.sampling.logit_bias.empty()) validate_sampling(a.sampling, model.n_vocab());
      if (a.sampling.grammar.empty() || !checked.insert(a.sampling.grammar).second) continue;
      check_grammar(model, a.sampling.grammar);
    } catch (const Error& e) {
      throw Error(e.code(), fmt::format("agent '{}': {}", a.name, e.message()));
    }
  }
}

}  // namespace

PreparedPipeline prepare_pipeline(const PipelineSpec& given, const Model& model) {
  std::optional<PipelineSpec> storage;
  const PipelineSpec& spec = exact_settled(given, model, storage);
  validate_pipeline(spec);
  if (spec.exact && spec.any_needs() && fork_traits(spec.fork).one_context &&
      !attention_batch_invariant()) {
    throw Error(ErrorCode::kInvalidArgument,
                "needs under exact mode and fork shared streams the document beside the agents' "
                "steps, which is exact on the batch-invariant attention kernel only, and "
                "GGML_CPU_FA_BATCH_INVARIANT=0 turns it off: unset it, or use fork host");
  }
  const TemplateSplit split = split_template(spec, model);

  PreparedPipeline out;
  out.prefix = model.tokenize(split.head, /*add_special=*/true);
  out.branch_tail = split.texts[1];
  out.turn_close = split.turn_close;
  locate_document(spec, model, split, out);
  const std::unordered_map<std::string_view, size_t> index = agent_indices(spec);
  const std::vector<int64_t> own = own_prompt_tokens(spec, model, index, out);
  const std::vector<int32_t> new_cells = budget_branches(spec, model, index, own, out);
  check_tree_ids(spec);
  check_positions(spec, model, out);
  check_against_model(spec, model);
  std::vector<int32_t> max_tokens;
  for (const AgentSpec& a : spec.agents) max_tokens.push_back(a.max_tokens);
  out.budget =
      plan_budget(spec.fork, static_cast<int32_t>(out.prefix.size()),
                  fork_traits(spec.fork).one_context ? new_cells : out.budgeted_prompt_tokens,
                  max_tokens, spec.n_ctx);
  return out;
}

MemoryEstimate estimate_memory(const PipelineSpec& spec, const Model& model,
                               const PipelineBudget& budget, GuardPolicy guard) {
  const ForkTraits traits = fork_traits(spec.fork);
  ContextOptions branch = spec.context_options();
  branch.n_ctx = budget.n_ctx;
  branch.n_seq_max = budget.n_seq_max;
  if (traits.one_context) {
    branch.n_batch = std::max(spec.n_batch, budget.n_seq_max);
    branch.n_ubatch = branch.n_batch;
  }
  const ContextMemory per_context = estimate_context_memory(model, branch);
  const size_t agents = spec.agents.size();
  const uint64_t contexts =
      !traits.branch_workers || guard == GuardPolicy::kSerialized
          ? 1
          : std::clamp<uint64_t>(static_cast<uint64_t>(hardware_threads()), 1, agents);
  uint64_t total = contexts * per_context.total();
  std::string parts = fmt::format(
      "{} context(s) x n_ctx {}: KV {:.2f} GiB + attention scratch "
      "{:.2f} GiB each",
      contexts, budget.n_ctx, per_context.kv_bytes / 1073741824.0,
      per_context.compute_bytes / 1073741824.0);
  if (traits.prefix_state) {
    const ContextMemory prefill = estimate_context_memory(
        model, detail::prefill_context_options(spec, static_cast<size_t>(budget.prefix_tokens)));
    total += prefill.total();
    parts += fmt::format("; the prefill context {:.2f} GiB", prefill.total() / 1073741824.0);
    if (traits.host_buffers) {
      // The prefix's state in host memory: the snapshot and one branch buffer per worker.
      ContextOptions cells = branch;
      cells.n_ctx = static_cast<uint32_t>(budget.prefix_tokens);
      const uint64_t state = estimate_context_memory(model, cells).kv_bytes;
      total += state * (1 + contexts);
      parts += fmt::format("; host buffers {:.2f} GiB", state * (1 + contexts) / 1073741824.0);
    }
  }
  return {total, std::move(parts)};
}

void check_memory(const PipelineSpec& spec, const Model& model, const PipelineBudget& budget,
                  GuardPolicy guard) {
  const MemoryEstimate need = estimate_memory(spec, model, budget, guard);
  require_memory(need.bytes, fmt::format("fork {}", to_string(spec.fork)), need.parts,
                 "shorten the document, lower max_tokens or run fewer agents");
}

PrefillReport prefill_document(const PipelineSpec& given, const std::shared_ptr<const Model>& model,
                               const RunOptions& options, const std::string& out_path) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "prefill_document needs a model");
  std::optional<PipelineSpec> storage;
  const PipelineSpec& spec = exact_settled(given, *model, storage);
  const std::vector<Token> prefix = prepare_prefix(spec, *model);
  detail::PrefixState state = detail::obtain_prefix_state(spec, prefix, options.snapshot,
                                                          options.on_prefill_progress, model);
  PrefillReport report;
  report.prefix_tokens = static_cast<int32_t>(prefix.size());
  report.prefill_ms = state.prefill_ms;
  report.export_ms = state.export_ms;
  if (!out_path.empty()) {
    const Stopwatch w;
    write_snapshot(out_path, detail::prefix_meta(*model, spec, prefix), state.bytes);
    report.write_ms = w.ms();
    report.out_path = out_path;
  }
  report.snapshot = std::move(state.use);
  return report;
}

const ErrorValue* state_error(const PipelineResult& r) {
  if (r.document_error && r.document_error->code == ErrorCode::kCorruption)
    return &*r.document_error;
  for (const AgentResult& a : r.agents)
    if (a.error && a.error->code == ErrorCode::kCorruption) return &*a.error;
  return nullptr;
}

PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options) {
  return detail::run_pipeline(spec, model, options, detail::RunFaults{});
}

PipelineResult run_pipeline(const PipelineSpec& spec, const PreparedPipeline& prepared,
                            const std::shared_ptr<const Model>& model, const RunOptions& options) {
  return detail::run_pipeline(spec, model, options, detail::RunFaults{}, &prepared);
}

PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options, AgentExecutor& executor) {
  return detail::run_pipeline(spec, model, options, detail::RunFaults{}, nullptr, &executor);
}

namespace detail {

ReadySet ready_set(const PipelineSpec& spec) {
  const std::vector<DagNode> nodes = dag_nodes(spec);
  std::vector<std::string> names;
  std::vector<int32_t> priorities{0};
  for (const DagNode& n : nodes) names.push_back(n.name);
  for (const AgentSpec& a : spec.agents) priorities.push_back(a.priority);
  return ReadySet(std::move(names), resolve_dag(nodes), std::move(priorities));
}

std::vector<Token> tokenize_branch(const Model& model, const PreparedPipeline& prepared,
                                   std::string_view prompt) {
  const Model::TextPiece pieces[] = {{prompt, false}, {prepared.branch_tail, true}};
  return model.tokenize(std::span(pieces, prepared.branch_tail.empty() ? 1 : 2),
                        /*add_special=*/false);
}

namespace {

// A finished agent's branch as it decoded it: its ancestors' turns, then its
// own rendered prompt.
std::vector<Token> finished_branch(const RunInputs& in, size_t agent,
                                   const PipelineResult& result) {
  std::vector<Token> out;
  if (const std::string& parent = in.spec.agents[agent].fork_from; !parent.empty()) {
    const size_t p = *in.spec.agent_index(parent);  // validated: an agent's name
    out = finished_branch(in, p, result);
    const std::vector<Token>& answer = result.agents[p].tokens;
    out.insert(out.end(), answer.begin(), answer.end());
    const std::vector<Token> close = in.model->tokenize(in.prepared.turn_close, false, true);
    out.insert(out.end(), close.begin(), close.end());
  }
  if (in.spec.agents[agent].needs.any())
    out.insert(out.end(), in.prepared.doc_close.begin(), in.prepared.doc_close.end());
  const std::vector<Token> own =
      tokenize_branch(*in.model, in.prepared, result.agents[agent].prompt_rendered);
  out.insert(out.end(), own.begin(), own.end());
  return out;
}

}  // namespace

void report_started(const RunInputs& in, size_t agent) {
  if (!in.options.on_agent_event) return;
  in.options.on_agent_event({.kind = AgentEvent::Kind::kStarted,
                             .agent = agent,
                             .token = -1,
                             .text = {},
                             .result = nullptr});
}

void settle_structured_answer(const AgentSpec& agent, AgentResult& out) {
  if (agent.sampling.grammar.empty()) return;
  const std::string_view what = agent.json_schema.empty() ? "grammar" : "JSON";
  if (out.stop_reason != StopReason::kEndOfGeneration) {
    throw Error(ErrorCode::kBudget,
                fmt::format("the answer is incomplete: it reached max_tokens={} before its {} "
                            "was complete (raise max_tokens)",
                            agent.max_tokens, what));
  }
  if (agent.json_schema.empty()) return;
  if (!nlohmann::json::accept(out.answer)) {
    throw Error(ErrorCode::kInternal,
                "the answer completed its JSON schema's grammar but does not parse as JSON");
  }
  out.answer_is_json = true;
}

std::function<void(Token, const std::string&)> branch_token_callback(const RunInputs& in,
                                                                     size_t agent,
                                                                     PipelineResult& result) {
  return [&in, agent, &token_at = result.agents[agent].token_at_ms](Token token,
                                                                    const std::string& text) {
    token_at.push_back(ms_between(in.started, Clock::now()));
    if (!in.options.on_agent_event) return;
    in.options.on_agent_event({.kind = AgentEvent::Kind::kToken,
                               .agent = agent,
                               .token = token,
                               .text = text,
                               .result = nullptr});
  };
}

std::vector<Token> branch_tokens(const RunInputs& in, size_t agent, PipelineResult& result) {
  const AgentSpec& spec = in.spec.agents[agent];
  if (!renders_at_start(spec)) return in.prepared.branches[agent];
  // The upstream agents have finished: their answers are in the result.
  const auto answers =
      placeholder_values(in.spec, spec.prompt,
                         [&](size_t k) -> const std::string& { return result.agents[k].answer; });
  AgentResult& out = result.agents[agent];
  out.prompt_rendered = agent_turn(spec, answers);
  std::vector<Token> tokens = finished_branch(in, agent, result);
  out.prompt_tokens = static_cast<int32_t>(tokens.size());
  const int32_t budgeted = in.prepared.budgeted_prompt_tokens[agent];
  if (out.prompt_tokens > budgeted) {
    throw Error(ErrorCode::kBudget,
                fmt::format("agent '{}': its branch has {} tokens, more than the {} the budget "
                            "counted (its prompt without placeholders, plus the max_tokens of "
                            "each agent they name, plus its fork_from ancestors' branches)",
                            spec.name, out.prompt_tokens, budgeted));
  }
  return tokens;
}

namespace {

// The result before anything runs: the settings it ran with, the agents'
// names, edges and prompts.
PipelineResult result_before_the_run(const PipelineSpec& asked, const PipelineSpec& spec,
                                     const Model& model, const PreparedPipeline& prepared) {
  PipelineResult result;
  result.fork = spec.fork;
  result.exact = spec.exact;
  if (asked.exact && !spec.exact) result.exact_unavailable = model.exact_unavailable();
  result.engine = spec.context_options();
  result.n_gpu_layers = model.options().n_gpu_layers;
  result.offloaded_layers = model.offloaded_layers();
  result.prefix_tokens = prepared.budget.prefix_tokens;
  result.n_ctx = prepared.budget.n_ctx;  // the strategy replaces it with llama.cpp's padded value
  result.pipeline = spec.name;
  result.model = model.path();
  result.agents.resize(spec.agents.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    result.agents[i].name = spec.agents[i].name;
    result.agents[i].depends_on = spec.agents[i].depends_on;
    result.agents[i].fork_from = spec.agents[i].fork_from;
    result.agents[i].needs = spec.agents[i].needs;
    result.agents[i].prompt_tokens = static_cast<int32_t>(prepared.branches[i].size());
    if (prompt_placeholders(spec.agents[i].prompt).empty())
      result.agents[i].prompt_rendered = agent_turn(spec.agents[i], {});
  }
  return result;
}

// Each agent's outcome reaches options.on_agent_event as the DAG decides it.
void report_outcomes(ReadySet& dag, PipelineResult& result, const RunOptions& options) {
  if (!options.on_agent_event) return;
  dag.set_on_decided([&dag, &result, &options](size_t node) {
    if (node == 0) return;
    AgentResult& a = result.agents[node - 1];
    a.status = dag.status(node);
    a.error = dag.error(node);
    try {
      options.on_agent_event({.kind = AgentEvent::Kind::kDone,
                              .agent = node - 1,
                              .token = -1,
                              .text = {},
                              .result = &a});
    } catch (...) {
      log_warn("pipeline: the agent event callback failed for agent '{}' ({}); ignored", a.name,
               current_error_value().to_string());
    }
  });
}

// A store entry whose state failed after its restore is removed by name.
void remove_failed_store_entry(PipelineResult& result, const RunOptions& options) {
  const ErrorValue* bad = state_error(result);
  if (!bad || !result.snapshot || result.snapshot->source != SnapshotSource::kCache ||
      options.snapshot.cache != SnapshotCacheMode::kOn) {
    return;
  }
  SnapshotStore(snapshot_store_dir(options.snapshot.cache_dir)).remove_path(result.snapshot->path);
  log_warn("snapshot cache: removed entry {}: its state failed after the restore ({})",
           result.snapshot->path, bad->to_string());
  result.snapshot->discarded.push_back(*bad);
}

}  // namespace

PipelineResult run_pipeline(const PipelineSpec& asked, const std::shared_ptr<const Model>& model,
                            const RunOptions& options, const RunFaults& faults,
                            const PreparedPipeline* given, AgentExecutor* executor) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_pipeline needs a model");
  std::optional<PipelineSpec> storage;
  const PipelineSpec& spec = exact_settled(asked, *model, storage);
  const Stopwatch run;
  if (executor) executor->check(spec);
  std::optional<PreparedPipeline> own;
  const PreparedPipeline& prepared = given ? *given : own.emplace(prepare_pipeline(spec, *model));
  if (!executor) check_memory(spec, *model, prepared.budget, options.guard);

  PipelineResult result = result_before_the_run(asked, spec, *model, prepared);
  result.prepare_ms = run.ms();
  ReadySet dag = ready_set(spec);
  report_outcomes(dag, result, options);
  const RunInputs in{
      spec,
      prepared,
      options,
      model,
      faults.branch_pos0 >= 0 ? faults.branch_pos0 : static_cast<Pos>(prepared.prefix.size()),
      run.started()};
  (executor ? make_executor_fork(*executor, spec.fork)
            : make_fork_strategy(spec.fork, options.guard))
      ->run(in, dag, result);
  if (!dag.finished()) throw Error(ErrorCode::kInternal, "the fork strategy left agents unrun");

  result.document_status = dag.status(0);
  result.document_error = dag.error(0);
  for (size_t i = 0; i < result.agents.size(); ++i) {
    result.agents[i].status = dag.status(i + 1);
    result.agents[i].error = dag.error(i + 1);
  }
  remove_failed_store_entry(result, options);
  result.total_ms = run.ms();
  return result;
}

}  // namespace detail
}  // namespace swarmkv
