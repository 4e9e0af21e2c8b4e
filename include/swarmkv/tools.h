// Tool calls as constrained answers: the functions an answer may call, the
// JSON Schema of such a call (its grammar makes every answer one), the text
// that tells the model its tools, and OpenAI's "tool_calls" of an answer.
// One implementation for serve's "tools" and a pipeline agent's `tools:`.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace swarmkv {

// A function an answer may call.
struct ToolFunction {
  std::string name;  // 1 to 64 of a-z, A-Z, 0-9, _ and -
  std::string description;
  // The JSON Schema of its arguments as JSON text, keys in the order given
  // (the arguments are generated in it); "{}" when not given.
  std::string parameters = "{}";
  bool operator==(const ToolFunction&) const = default;
};

// `tools` read as an array of OpenAI's {"type": "function", "function":
// {"name", "description", "parameters"}} or of the inner {"name", ...}
// alone. Throws Error(kInvalidArgument) "<field>[i]...: <what>" (e.g.
// "tools[0].function.name: names another tool's function too").
std::vector<ToolFunction> tools_from_json(const nlohmann::ordered_json& tools,
                                          std::string_view field);
// OpenAI's shape of `tools` (what tools_from_json reads back the same).
nlohmann::ordered_json tools_json(std::span<const ToolFunction> tools);
// The one of `tools` named `name`, alone (tool_choice naming a function).
// Throws Error(kInvalidArgument) "<field>: no tool is named ...".
std::vector<ToolFunction> tool_named(std::span<const ToolFunction> tools, std::string_view name,
                                     std::string_view field);

// The JSON Schema of a call of one of `tools`: {"name": <one's name>,
// "arguments": <its parameters>}, name first; a function without
// parameters (or with {}) takes none: its arguments are {}. With `or_text`
// (OpenAI's tool_choice "auto") the answer may instead be {"response":
// "<text>"}: a call or text, the model's choice.
std::string tool_call_schema(std::span<const ToolFunction> tools, bool or_text = false);
// The instruction that tells the model its tools and the call's form (and,
// with `or_text`, the text answer's).
std::string tools_prompt(std::span<const ToolFunction> tools, bool or_text = false);
// The text of an answer sampled under tool_call_schema(..., true) that chose
// to answer in text ({"response": ...}); nullopt for a call.
std::optional<std::string> response_of(const std::string& answer);
// OpenAI's "tool_calls" of an answer sampled under tool_call_schema's
// grammar. Throws Error(kInternal) for one that is not such a call.
nlohmann::json tool_calls_of(const std::string& answer, const std::string& call_id);

}  // namespace swarmkv
