#include "server/openai.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <string_view>

#include <fmt/format.h>

#include "swarmkv/paths.h"

namespace swarmkv::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;  // where the order of a schema's properties counts

std::string shown(const json& value) {
  std::string s = value.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// A number field within [lo, hi] (an open bound where `open_lo`).
float number(const json& body, std::string_view field, float lo, float hi, float fallback,
             bool open_lo = false) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) refuse(field, fmt::format("must be a number (got {})", shown(*it)));
  const double v = it->get<double>();
  if (!std::isfinite(v) || v > hi || v < lo || (open_lo && v <= lo)) {
    refuse(field, fmt::format("must be in {}{}, {}] (got {})", open_lo ? "(" : "[", lo, hi, v));
  }
  return static_cast<float>(v);
}

// An integer field within [lo, hi]; a whole number written with a fraction
// or an exponent (10.0, 1e1) counts, JSON having one number type.
std::optional<int64_t> integer(const json& body, std::string_view field, int64_t lo, int64_t hi) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return std::nullopt;
  if (it->is_number_float()) {
    const double v = it->get<double>();
    // Whole and inside int64 (2^63 is the first double past it).
    if (v == std::trunc(v) && std::abs(v) < 9.2233720368547758e18) {
      json whole = static_cast<int64_t>(v);
      return integer(json{{std::string(field), whole}}, field, lo, hi);
    }
  }
  if (!it->is_number_integer()) {
    refuse(field, fmt::format("must be an integer (got {})", shown(*it)));
  }
  const bool above = it->is_number_unsigned()
                         ? it->get<uint64_t>() > static_cast<uint64_t>(std::max<int64_t>(hi, 0))
                         : it->get<int64_t>() > hi;
  if (above || (!it->is_number_unsigned() && it->get<int64_t>() < lo) ||
      (it->is_number_unsigned() && lo > 0 && it->get<uint64_t>() < static_cast<uint64_t>(lo))) {
    refuse(field, fmt::format("must be in [{}, {}] (got {})", lo, hi, it->dump()));
  }
  return it->get<int64_t>();
}

bool boolean(const json& body, std::string_view field) {
  const auto it = body.find(field);
  if (it == body.end() || it->is_null()) return false;
  if (!it->is_boolean()) refuse(field, fmt::format("must be true or false (got {})", shown(*it)));
  return it->get<bool>();
}

// A message's content: a string, or an array of {"type": "text", "text"}
// parts, joined.
std::string content_of(const json& message, const std::string& field) {
  const auto it = message.find("content");
  if (it == message.end() || it->is_null()) {
    refuse(field + ".content", "is missing (a string or an array of text parts)");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array()) {
    refuse(field + ".content",
           fmt::format("must be a string or an array of text parts (got {})", shown(*it)));
  }
  std::string text;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& part = (*it)[i];
    const std::string at = fmt::format("{}.content[{}]", field, i);
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string()) {
      refuse(at, fmt::format("must be {{\"type\": \"text\", \"text\": ...}}; only text is "
                             "supported (got {})",
                             shown(part)));
    }
    text += part["text"].get<std::string>();
  }
  return text;
}

// An assistant message's "tool_calls" as the model sees its own calls: one
// {"name", "arguments"} object per line, the shape a tool call is sampled in.
std::string calls_as_text(const json& calls, const std::string& field) {
  if (!calls.is_array() || calls.empty()) {
    refuse(field, fmt::format("must be a non-empty array of tool calls (got {})", shown(calls)));
  }
  std::string text;
  for (size_t i = 0; i < calls.size(); ++i) {
    const json& call = calls[i];
    const std::string at = fmt::format("{}[{}]", field, i);
    const json* function =
        call.is_object() && call.contains("function") && call["function"].is_object()
            ? &call["function"]
            : nullptr;
    if (function == nullptr || !function->contains("name") || !(*function)["name"].is_string() ||
        !function->contains("arguments") || !(*function)["arguments"].is_string()) {
      refuse(at, fmt::format("must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", "
                             "\"arguments\"}}}} with arguments a JSON string (got {})",
                             shown(call)));
    }
    json arguments;
    try {
      arguments = json::parse((*function)["arguments"].get<std::string>());
    } catch (const json::exception&) {
      refuse(at + ".function.arguments", "must be JSON text (the call's arguments object)");
    }
    if (!text.empty()) text += "\n";
    text += json{{"name", (*function)["name"]}, {"arguments", arguments}}.dump();
  }
  return text;
}

// A "tool" message: the result of a call, shown to the model as a user turn
// (every chat template has one; few of them have a tool role).
ChatMessage tool_result(const json& m, const std::string& field) {
  const auto id = m.find("tool_call_id");
  if (id == m.end() || !id->is_string()) {
    refuse(field + ".tool_call_id", "is missing (the id of the call this message answers)");
  }
  return {"user", fmt::format("The tool call {} returned:\n{}", id->get<std::string>(),
                              content_of(m, field))};
}

// "messages": each one's role and text.
std::vector<ChatMessage> messages_of(const json& body, const RequestLimits& limits) {
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty()) {
    refuse("messages", "must be a non-empty array of {\"role\", \"content\"} objects");
  }
  if (messages->size() > static_cast<size_t>(limits.max_messages)) {
    refuse("messages", fmt::format("at most {} messages per request (got {})", limits.max_messages,
                                   messages->size()));
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string field = fmt::format("messages[{}]", i);
    if (!m.is_object()) refuse(field, fmt::format("must be an object (got {})", shown(m)));
    const auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      refuse(field + ".role", "is missing (system, user or assistant)");
    }
    std::string name = role->get<std::string>();
    if (name == "developer") name = "system";  // OpenAI's newer name for it
    if (name != "system" && name != "user" && name != "assistant" && name != "tool") {
      refuse(field + ".role",
             fmt::format("must be system, user, assistant or tool (got {})", shown(*role)));
    }
    ChatMessage message{std::move(name), ""};
    if (const auto calls = m.find("tool_calls"); calls != m.end() && !calls->is_null()) {
      if (message.role != "assistant") {
        refuse(field + ".tool_calls", "only an assistant message makes tool calls");
      }
      message.content = calls_as_text(*calls, field + ".tool_calls");
      if (const auto c = m.find("content"); c != m.end() && !c->is_null()) {
        message.content = content_of(m, field) + "\n" + message.content;
      }
    } else if (message.role == "tool") {
      message = tool_result(m, field);
    } else {
      message.content = content_of(m, field);
    }
    require_text(message.content, field + ".content");
    out.push_back(std::move(message));
  }
  return out;
}

// "response_format": text, or a JSON answer (any object, or one that
// satisfies a schema) as the grammar the answer is sampled under; empty for
// text.
std::string grammar_of(const json& body, const ordered_json& ordered) {
  const auto it = body.find("response_format");
  if (it == body.end() || it->is_null()) return {};
  const std::string type = it->is_object() ? it->value("type", std::string()) : std::string();
  if (type == "text") return {};
  std::string schema;
  if (type == "json_object") {
    schema = R"({"type": "object"})";
  } else if (type == "json_schema") {
    const auto spec = it->find("json_schema");
    if (spec == it->end() || !spec->is_object() || !spec->contains("schema")) {
      refuse("response_format.json_schema",
             "must be {\"name\": ..., \"schema\": {...}} (the schema is missing)");
    }
    schema = ordered["response_format"]["json_schema"]["schema"].dump();  // properties in order
  } else {
    refuse("response_format",
           fmt::format("type must be text, json_object or json_schema (got {})", shown(*it)));
  }
  try {
    return grammar_from_json_schema(schema);
  } catch (const Error& e) {
    refuse("response_format.json_schema.schema", e.value().message);
  }
}

// Every field of the body is one read here or one of OpenAI's that carries
// no meaning for us (accepted and ignored: docs/serve.md); anything else,
// grammar and top_logprobs among them, is refused by name rather than ignored.
// A field that neither both completion routes read (read_generation,
// read_stream, the model, logprobs in each route's form), nor the route's
// `own`, nor `ignored` is refused by name.
void refuse_unknown_fields(const json& body, const std::set<std::string_view>& own,
                           const std::set<std::string_view>& ignored) {
  static const std::set<std::string_view> kGeneration = {"model",
                                                         "max_tokens",
                                                         "temperature",
                                                         "top_p",
                                                         "top_k",
                                                         "min_p",
                                                         "logit_bias",
                                                         "frequency_penalty",
                                                         "presence_penalty",
                                                         "repeat_penalty",
                                                         "seed",
                                                         "n",
                                                         "stop",
                                                         "stream",
                                                         "stream_options",
                                                         "logprobs"};
  for (const auto& item : body.items()) {
    if (kGeneration.contains(item.key()) || own.contains(item.key()) ||
        ignored.contains(item.key())) {
      continue;
    }
    refuse(item.key(),
           "is not supported by swarmkv serve (docs/serve.md lists the fields it takes)");
  }
}

void refuse_unknown_chat_fields(const json& body) {
  static const std::set<std::string_view> kOwn = {
      "messages",  "max_completion_tokens", "response_format", "tools",
      "functions", "tool_choice",           "function_call",   "top_logprobs"};
  static const std::set<std::string_view> kIgnored = {"user", "metadata", "store", "service_tier",
                                                      "parallel_tool_calls"};
  refuse_unknown_fields(body, kOwn, kIgnored);
}

// OpenAI's legacy "functions" are refused.
void refuse_unsupported(const json& body) {
  for (const char* legacy : {"functions", "function_call"}) {
    if (const auto it = body.find(legacy);
        it != body.end() && !it->is_null() && *it != "none" && !(it->is_array() && it->empty())) {
      refuse(legacy, "is OpenAI's legacy form of tool calls; send \"tools\" and \"tool_choice\"");
    }
  }
}

// "tools" (tools_from_json), the schemas' properties in the client's order.
std::vector<ToolFunction> tools_of(const json& body, const ordered_json& ordered) {
  const auto it = body.find("tools");
  if (it == body.end() || it->is_null()) return {};
  return tools_from_json(ordered["tools"], "tools");
}

// "tool_choice" over "tools": the functions the answer may call (empty: the
// answer is text); `or_text` is set for "auto" (the default with tools): a
// call or text ({"response": ...}), the model's choice.
std::vector<ToolFunction> called_tools(const json& body, std::vector<ToolFunction> tools,
                                       bool& or_text) {
  const auto it = body.find("tool_choice");
  const json choice =
      it == body.end() || it->is_null() ? json(tools.empty() ? "none" : "auto") : *it;
  if (choice == "none") return {};
  if (tools.empty()) refuse("tool_choice", fmt::format("{} needs \"tools\"", shown(choice)));
  if (choice == "required") return tools;
  if (choice == "auto") {
    or_text = true;
    return tools;
  }
  if (!choice.is_object() || choice.value("type", json()) != "function" ||
      !choice.contains("function") || !choice["function"].is_object() ||
      !choice["function"].contains("name") || !choice["function"]["name"].is_string()) {
    refuse("tool_choice",
           fmt::format("must be \"none\", \"required\" or {{\"type\": \"function\", \"function\": "
                       "{{\"name\": ...}}}} (got {})",
                       shown(choice)));
  }
  return tool_named(tools, choice["function"]["name"].get<std::string>(),
                    "tool_choice.function.name");
}

// "logit_bias": OpenAI's {"token id": bias in [-100, 100]} (ids as strings;
// the sampler refuses one outside the vocabulary).
std::vector<std::pair<Token, float>> logit_bias_of(const json& body) {
  std::vector<std::pair<Token, float>> biases;
  const auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return biases;
  if (!it->is_object()) {
    refuse("logit_bias", fmt::format("must be an object of token id -> bias (got {})", shown(*it)));
  }
  constexpr size_t kMostBiases = 1024;
  if (it->size() > kMostBiases) {
    refuse("logit_bias", fmt::format("at most {} tokens (got {})", kMostBiases, it->size()));
  }
  for (const auto& item : it->items()) {
    const std::string& key = item.key();
    Token token = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), token);
    if (ec != std::errc() || end != key.data() + key.size() || token < 0) {
      refuse(fmt::format("logit_bias.{}", shown(json(key))),
             "keys must be token ids (non-negative integers as strings)");
    }
    const std::string field = fmt::format("logit_bias.{}", key);
    if (!item.value().is_number()) {
      refuse(field, fmt::format("must be a number (got {})", shown(item.value())));
    }
    const double bias = item.value().get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      refuse(field, fmt::format("must be in [-100, 100] (got {})", shown(item.value())));
    }
    biases.emplace_back(token, static_cast<float>(bias));
  }
  return biases;
}

// "max_tokens" or "max_completion_tokens" (the same if both), the sampling
// settings and "n".
void read_generation(const json& body, const RequestLimits& limits, ChatRequest& r) {
  const auto max_tokens = integer(body, "max_tokens", 1, limits.max_tokens);
  const auto max_completion = integer(body, "max_completion_tokens", 1, limits.max_tokens);
  if (max_tokens && max_completion && *max_tokens != *max_completion) {
    refuse("max_completion_tokens", fmt::format("differs from max_tokens ({} vs {}); give one",
                                                *max_completion, *max_tokens));
  }
  r.max_tokens = static_cast<int32_t>(max_completion.value_or(max_tokens.value_or(0)));

  r.sampling.temperature = number(body, "temperature", 0.0f, 2.0f, 1.0f);
  r.sampling.top_p = number(body, "top_p", 0.0f, 1.0f, 1.0f, /*open_lo=*/true);
  r.sampling.frequency_penalty = number(body, "frequency_penalty", -2.0f, 2.0f, 0.0f);
  r.sampling.presence_penalty = number(body, "presence_penalty", -2.0f, 2.0f, 0.0f);
  // llama-server's names for what pipelines have too.
  r.sampling.top_k = static_cast<int32_t>(integer(body, "top_k", 0, 1 << 20).value_or(0));
  r.sampling.repeat_penalty = number(body, "repeat_penalty", 0.0f, 10.0f, 1.0f, /*open_lo=*/true);
  r.sampling.min_p = number(body, "min_p", 0.0f, 1.0f, 0.0f);
  r.sampling.logit_bias = logit_bias_of(body);
  if (const auto seed = integer(body, "seed", INT64_MIN, INT64_MAX)) {
    r.sampling.seed = static_cast<uint32_t>(*seed);
    r.seed_given = true;
  }
  // OpenAI counts penalties over the whole completion.
  if (r.sampling.penalties_on()) r.sampling.repeat_last_n = limits.max_tokens;
  r.n = static_cast<int32_t>(integer(body, "n", 1, limits.max_n).value_or(1));
}

// "stream" and "stream_options".
void read_stream(const json& body, ChatRequest& r) {
  r.stream = boolean(body, "stream");
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) refuse("stream_options", "must be an object");
    if (!r.stream) refuse("stream_options", "is only allowed with \"stream\": true");
    r.include_usage = boolean(*it, "include_usage");
  }
}

// "stop": a string or an array of them, none empty.
std::vector<std::string> stops_of(const json& body, const RequestLimits& limits) {
  std::vector<std::string> stop;
  const auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return stop;
  if (it->is_string()) {
    stop.push_back(it->get<std::string>());
  } else if (it->is_array()) {
    for (size_t i = 0; i < it->size(); ++i) {
      if (!(*it)[i].is_string()) {
        refuse(fmt::format("stop[{}]", i),
               fmt::format("must be a string (got {})", shown((*it)[i])));
      }
      stop.push_back((*it)[i].get<std::string>());
    }
  } else {
    refuse("stop", fmt::format("must be a string or an array of strings (got {})", shown(*it)));
  }
  if (stop.size() > static_cast<size_t>(limits.max_stop)) {
    refuse("stop", fmt::format("at most {} stop strings (got {})", limits.max_stop, stop.size()));
  }
  for (const std::string& s : stop) {
    if (s.empty()) refuse("stop", "an empty stop string would end every answer at once");
  }
  return stop;
}

}  // namespace

void refuse(std::string_view field, std::string_view what) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", field, what));
}

json parse_body(std::string_view body) {
  try {
    return json::parse(body);
  } catch (const json::exception& e) {
    refuse("body", fmt::format("not JSON ({})", e.what()));
  }
}

ChatRequest parse_chat_request(std::string_view body_text, const RequestLimits& limits) {
  const json body = parse_body(body_text);
  if (!body.is_object()) refuse("body", fmt::format("must be a JSON object (got {})", shown(body)));

  ChatRequest r;
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) refuse("model", fmt::format("must be a string (got {})", shown(*it)));
    r.model = it->get<std::string>();
  }
  r.messages = messages_of(body, limits);
  refuse_unknown_chat_fields(body);
  refuse_unsupported(body);
  read_generation(body, limits, r);
  const auto top = integer(body, "top_logprobs", 0, 20);
  if (boolean(body, "logprobs")) {
    r.sampling.top_logprobs = static_cast<int32_t>(top.value_or(0));
  } else if (top) {
    refuse("top_logprobs", "needs \"logprobs\": true");
  }
  // The schemas' properties are sampled in the order the client gave them
  // (read again, in order, only where there are schemas).
  const auto ordered = body.contains("response_format") || body.contains("tools")
                           ? ordered_json::parse(body_text)
                           : ordered_json();
  r.sampling.grammar = grammar_of(body, ordered);
  r.tools = called_tools(body, tools_of(body, ordered), r.tool_or_text);
  if (!r.tools.empty()) {
    if (!r.sampling.grammar.empty()) {
      refuse("response_format",
             "cannot be combined with a tool call (tool_choice makes the answer "
             "a call)");
    }
    try {
      r.sampling.grammar = grammar_from_json_schema(tool_call_schema(r.tools, r.tool_or_text));
    } catch (const Error& e) {
      refuse("tools", e.value().message);
    }
    const std::string prompt = tools_prompt(r.tools, r.tool_or_text);
    if (r.messages.front().role == "system") {
      r.messages.front().content += "\n\n" + prompt;
    } else {
      r.messages.insert(r.messages.begin(), ChatMessage{"system", prompt});
    }
  }
  r.stop = stops_of(body, limits);
  read_stream(body, r);
  return r;
}

ChatRequest parse_completion_request(std::string_view body_text, const RequestLimits& limits) {
  const json body = parse_body(body_text);
  if (!body.is_object()) refuse("body", fmt::format("must be a JSON object (got {})", shown(body)));
  static const std::set<std::string_view> kOwn = {"prompt", "echo", "suffix", "best_of"};
  static const std::set<std::string_view> kIgnored = {"user"};
  refuse_unknown_fields(body, kOwn, kIgnored);
  ChatRequest r;
  r.endpoint = Endpoint::kCompletions;
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) refuse("model", fmt::format("must be a string (got {})", shown(*it)));
    r.model = it->get<std::string>();
  }
  const auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) refuse("prompt", "is missing (a string)");
  // Token ids, as OpenAI takes them: a prompt's tokens exactly as the
  // model decodes them (no BOS added); checked against the vocabulary by
  // the server.
  const auto token_ids = [](const json& ids, const std::string& field) {
    if (ids.empty()) refuse(field, "is empty");
    std::vector<Token> tokens;
    for (size_t i = 0; i < ids.size(); ++i) {
      const json& t = ids[i];
      if (!t.is_number_integer() || t.get<int64_t>() < 0 ||
          t.get<int64_t>() > std::numeric_limits<Token>::max()) {
        refuse(fmt::format("{}[{}]", field, i),
               fmt::format("must be a token id (a non-negative integer; got {})", shown(t)));
      }
      tokens.push_back(static_cast<Token>(t.get<int64_t>()));
    }
    return tokens;
  };
  const auto many = [&](size_t n) {
    if (n > static_cast<size_t>(limits.max_prompts)) {
      refuse("prompt",
             fmt::format("has {} prompts; at most {} per request", n, limits.max_prompts));
    }
  };
  const char* kShapes =
      "a string, a list of strings, a list of token ids or a list of lists of token ids";
  if (prompt->is_string()) {
    r.prompts.push_back(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty() && prompt->front().is_number()) {
    r.prompt_tokens.push_back(token_ids(*prompt, "prompt"));
  } else if (prompt->is_array() && !prompt->empty() && prompt->front().is_array()) {
    many(prompt->size());
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& p = (*prompt)[i];
      const std::string field = fmt::format("prompt[{}]", i);
      if (!p.is_array()) {
        refuse(field, fmt::format("must be a list of token ids like the first (got {})", shown(p)));
      }
      r.prompt_tokens.push_back(token_ids(p, field));
    }
  } else if (prompt->is_array() && !prompt->empty()) {
    many(prompt->size());
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& p = (*prompt)[i];
      if (!p.is_string()) {
        refuse(fmt::format("prompt[{}]", i),
               fmt::format("must be a string like the first (got {})", shown(p)));
      }
      r.prompts.push_back(p.get<std::string>());
      if (r.prompts.back().empty()) refuse(fmt::format("prompt[{}]", i), "is empty");
    }
  } else {
    refuse("prompt", fmt::format("must be {} (got {})", kShapes, shown(*prompt)));
  }
  if (!r.prompts.empty() && r.prompts.front().empty()) refuse("prompt", "is empty");
  // "max_tokens": 0 with echo: the prompt alone (scored, with logprobs), as
  // older loglikelihood clients ask for it.
  r.echo = boolean(body, "echo");
  const auto zero = body.find("max_tokens");
  const bool prompt_only =
      zero != body.end() && zero->is_number_integer() && zero->get<int64_t>() == 0;
  if (prompt_only && !r.echo) {
    refuse("max_tokens", "must be in [1, " + std::to_string(limits.max_tokens) +
                             "] (got 0); 0 only with echo: the prompt alone, scored with logprobs");
  }
  if (prompt_only) {
    json rest = body;
    rest.erase("max_tokens");
    read_generation(rest, limits, r);
    r.prompt_only = true;
  } else {
    read_generation(body, limits, r);
  }
  // OpenAI's default for this endpoint.
  if (r.max_tokens == 0 && !r.prompt_only) r.max_tokens = std::min(16, limits.max_tokens);
  if (const auto top = integer(body, "logprobs", 0, 5))
    r.sampling.top_logprobs = static_cast<int32_t>(*top);
  if (const auto it = body.find("suffix"); it != body.end() && !it->is_null() && *it != json("")) {
    refuse("suffix", "is not supported (no fill-in-the-middle)");
  }
  if (const auto best = integer(body, "best_of", 1, limits.max_n); best && *best != r.n) {
    refuse("best_of", fmt::format("must equal n ({}): answers are not ranked", r.n));
  }
  r.stop = stops_of(body, limits);
  read_stream(body, r);
  return r;
}

json logprobs_json(std::span<const SampledLogprobs> tokens) {
  const auto entry = [&](const TokenLogprob& t) {
    json bytes = json::array();
    for (const char c : t.text) bytes.push_back(static_cast<uint8_t>(c));
    return json{{"token", t.text}, {"logprob", t.logprob}, {"bytes", std::move(bytes)}};
  };
  json content = json::array();
  for (const SampledLogprobs& s : tokens) {
    json e = entry(s.sampled);
    json top = json::array();
    for (const TokenLogprob& t : s.top) top.push_back(entry(t));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_logprobs_json(std::span<const SampledLogprobs> tokens, size_t prompt_chars,
                              bool top, const PromptLogprobs* prompt) {
  json pieces = json::array();
  json logprobs = json::array();
  json tops = json::array();
  json offsets = json::array();
  size_t offset = prompt ? 0 : prompt_chars;
  const auto add = [&](const std::string& piece, json logprob, const SampledLogprobs* s) {
    pieces.push_back(piece);
    logprobs.push_back(std::move(logprob));
    offsets.push_back(offset);
    offset += piece.size();
    if (!top) return;
    if (s == nullptr) {
      tops.push_back(nullptr);
      return;
    }
    json likeliest = json::object();  // two tokens of one text: the likelier one's
    for (const TokenLogprob& t : s->top) {
      if (!likeliest.contains(t.text)) likeliest[t.text] = t.logprob;
    }
    tops.push_back(std::move(likeliest));
  };
  if (prompt) {
    if (prompt->unscored) add(*prompt->unscored, nullptr, nullptr);
    for (const SampledLogprobs& s : prompt->scored) add(s.sampled.text, s.sampled.logprob, &s);
  }
  for (const SampledLogprobs& s : tokens) add(s.sampled.text, s.sampled.logprob, &s);
  return {{"tokens", std::move(pieces)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", top ? std::move(tops) : json()},
          {"text_offset", std::move(offsets)}};
}

std::string param_of(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos) return "";
  const std::string head = message.substr(0, colon);
  if (head == "body" || head.find(' ') != std::string::npos) return "";
  return head;
}

HttpError http_error(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kTokenize:
    case ErrorCode::kChatTemplate:
    case ErrorCode::kGraph:
      return {400, "invalid_request_error", ""};
    case ErrorCode::kBudget:
      return {400, "invalid_request_error", "context_length_exceeded"};
    case ErrorCode::kNotFound:
      return {404, "invalid_request_error", ""};
    case ErrorCode::kNoKvSlot:
    case ErrorCode::kAborted:
      return {503, "server_error", ""};
    default:
      return {500, "server_error", ""};
  }
}

nlohmann::json error_body(const ErrorValue& error, const HttpError& as) {
  const std::string param = param_of(error.message);
  return {{"error",
           {{"message", error.message},
            {"type", as.type},
            {"param", param.empty() ? json() : json(param)},
            {"code", std::string(as.code.empty() ? to_string(error.code) : as.code)}}}};
}

std::string_view finish_reason(StopReason reason) noexcept {
  return reason == StopReason::kMaxTokens ? "length" : "stop";
}

}  // namespace swarmkv::server
