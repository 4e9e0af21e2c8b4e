#include "swarmkv/tools.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/error.h"

namespace swarmkv {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;  // where the order of a schema's properties counts

std::string shown(const ordered_json& value) {
  std::string s = value.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

[[noreturn]] void refuse(std::string_view field, std::string_view what) {
  throw Error(ErrorCode::kInvalidArgument, fmt::format("{}: {}", field, what));
}

constexpr std::string_view kNameChars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-";

}  // namespace

std::vector<ToolFunction> tools_from_json(const ordered_json& tools, std::string_view field) {
  if (!tools.is_array()) refuse(field, fmt::format("must be an array (got {})", shown(tools)));
  std::vector<ToolFunction> out;
  for (size_t i = 0; i < tools.size(); ++i) {
    const ordered_json& t = tools[i];
    std::string at = fmt::format("{}[{}]", field, i);
    const bool wrapped = t.is_object() && (t.contains("type") || t.contains("function"));
    if (!t.is_object() || (wrapped && (t.value("type", json()) != "function" ||
                                       !t.contains("function") || !t["function"].is_object()))) {
      refuse(at, fmt::format("must be {{\"type\": \"function\", \"function\": {{...}}}} (got {})",
                             shown(t)));
    }
    const ordered_json& f = wrapped ? t["function"] : t;
    if (wrapped) at += ".function";
    for (const auto& item : f.items()) {
      if (item.key() != "name" && item.key() != "description" && item.key() != "parameters" &&
          item.key() != "strict") {
        refuse(at + "." + item.key(),
               "is not a function's field (name, description, parameters, strict)");
      }
    }
    ToolFunction tool;
    if (!f.contains("name") || !f["name"].is_string()) refuse(at + ".name", "is missing");
    tool.name = f["name"].get<std::string>();
    if (tool.name.empty() || tool.name.size() > 64 ||
        tool.name.find_first_not_of(kNameChars) != std::string::npos) {
      refuse(at + ".name",
             fmt::format("must be 1 to 64 of a-z, A-Z, 0-9, _ and - (got {})", shown(f["name"])));
    }
    for (const ToolFunction& other : out) {
      if (other.name == tool.name) refuse(at + ".name", "names another tool's function too");
    }
    if (const auto d = f.find("description"); d != f.end() && !d->is_null()) {
      if (!d->is_string()) refuse(at + ".description", "must be a string");
      tool.description = d->get<std::string>();
    }
    const ordered_json parameters = f.value("parameters", ordered_json::object());
    if (!parameters.is_object()) {
      refuse(at + ".parameters",
             fmt::format("must be a JSON Schema object (got {})", shown(parameters)));
    }
    tool.parameters = parameters.dump();
    out.push_back(std::move(tool));
  }
  return out;
}

ordered_json tools_json(std::span<const ToolFunction> tools) {
  ordered_json out = ordered_json::array();
  for (const ToolFunction& t : tools) {
    ordered_json f = {{"name", t.name}};
    if (!t.description.empty()) f["description"] = t.description;
    f["parameters"] = ordered_json::parse(t.parameters);
    out.push_back({{"type", "function"}, {"function", std::move(f)}});
  }
  return out;
}

std::vector<ToolFunction> tool_named(std::span<const ToolFunction> tools, std::string_view name,
                                     std::string_view field) {
  const auto named = std::find_if(tools.begin(), tools.end(),
                                  [&](const ToolFunction& t) { return t.name == name; });
  if (named == tools.end()) refuse(field, fmt::format("no tool is named {}", shown(json(name))));
  return {*named};
}

std::string tool_call_schema(std::span<const ToolFunction> tools, bool or_text) {
  ordered_json calls = ordered_json::array();
  for (const ToolFunction& t : tools) {
    // No parameters (or {}) is OpenAI's empty parameter list: the arguments
    // are {}, not any JSON (a small model given "any" rambles on).
    ordered_json arguments = ordered_json::parse(t.parameters);
    if (arguments.empty()) {
      arguments = {{"type", "object"},
                   {"properties", ordered_json::object()},
                   {"additionalProperties", false}};
    }
    // "name" first: the call is sampled in this order, the name deciding
    // which arguments follow.
    calls.push_back({{"type", "object"},
                     {"properties", {{"name", {{"const", t.name}}}, {"arguments", arguments}}},
                     {"required", {"name", "arguments"}},
                     {"additionalProperties", false}});
  }
  if (or_text) {
    calls.push_back({{"type", "object"},
                     {"properties", {{"response", {{"type", "string"}}}}},
                     {"required", {"response"}},
                     {"additionalProperties", false}});
  }
  if (calls.size() == 1) return calls[0].dump();
  return ordered_json{{"anyOf", calls}}.dump();
}

std::optional<std::string> response_of(const std::string& answer) {
  const json j = json::parse(answer, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.size() != 1 || !j.contains("response") || !j["response"].is_string()) {
    return std::nullopt;
  }
  return j["response"].get<std::string>();
}

std::string tools_prompt(std::span<const ToolFunction> tools, bool or_text) {
  std::string text =
      or_text ? "You may call a tool (its arguments follow the JSON Schema given) or answer in "
                "text. The tools:"
      : tools.size() == 1
          ? "Call this tool (its arguments follow the JSON Schema given):"
          : "Call one of these tools (their arguments follow the JSON Schemas given):";
  for (const ToolFunction& t : tools) {
    ordered_json entry = {{"name", t.name}};
    if (!t.description.empty()) entry["description"] = t.description;
    entry["parameters"] = ordered_json::parse(t.parameters);
    text += '\n';
    text += entry.dump();
  }
  text +=
      "\nAnswer with the call alone, as one JSON object: {\"name\": \"<the tool's name>\", "
      "\"arguments\": {...}}.";
  if (or_text) {
    text += " Without a call, answer as one JSON object: {\"response\": \"<your answer>\"}.";
  }
  return text;
}

json tool_calls_of(const std::string& answer, const std::string& call_id) {
  ordered_json call;  // the arguments go back in the order they were generated
  try {
    call = ordered_json::parse(answer);
  } catch (const json::exception& e) {
    throw Error(ErrorCode::kInternal,
                fmt::format("a tool call sampled under its grammar is not JSON ({})", e.what()));
  }
  if (!call.is_object() || !call.contains("name") || !call["name"].is_string() ||
      !call.contains("arguments")) {
    throw Error(
        ErrorCode::kInternal,
        fmt::format("a tool call sampled under its grammar lacks its name or arguments ({})",
                    answer.substr(0, 40)));
  }
  return json::array(
      {{{"id", call_id},
        {"type", "function"},
        {"function",
         {{"name", call["name"].get<std::string>()}, {"arguments", call["arguments"].dump()}}}}});
}

}  // namespace swarmkv
