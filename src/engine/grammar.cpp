// JSON Schema -> GBNF through llama.cpp's own converter (its common/ folder,
// compiled into our build as swarmkv_llama_common): the one place our code
// touches it.
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <string_view>

#include "json-schema-to-grammar.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv {

std::string grammar_from_json_schema(std::string_view schema) {
  common_json parsed;
  try {
    parsed = common_json::parse(std::string(schema));
  } catch (const std::exception& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the JSON schema is not JSON: {}", e.what()));
  }
  if (!parsed.is_object() && !parsed.is_boolean()) {
    throw Error(ErrorCode::kInvalidArgument,
                "a JSON schema is an object (or true/false); got " + parsed.dump());
  }
  try {
    return json_schema_to_grammar(parsed, /*force_gbnf=*/true);
  } catch (const std::exception& e) {
    // "JSON schema conversion failed:\nJSON schema error at <path>: <what>"
    std::string what = e.what();
    for (char& c : what) {
      if (c == '\n') c = ' ';
    }
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("llama.cpp's converter cannot make a grammar of this JSON schema: {}", what));
  }
}

}  // namespace swarmkv
