// Written against the engine API only (no llama.h here).
#include "swarmkv/synthetic.h"

#include <vector>

#include <fmt/format.h>

#include "swarmkv/error.h"

namespace swarmkv {

std::string synthetic_document(const Model& model, int32_t n_tokens) {
  if (n_tokens < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("a synthetic document needs >= 1 token (got {})", n_tokens));
  }
  constexpr std::string_view kPhrase = "The quick brown fox jumps over the lazy dog. ";
  std::string text;
  std::vector<Token> tokens;
  while (static_cast<int32_t>(tokens.size()) < n_tokens + 8) {
    for (int i = 0; i < 64; ++i) text += kPhrase;
    tokens = model.tokenize(text, false);
  }
  for (int32_t cut = n_tokens; cut > 0; --cut) {
    tokens.resize(static_cast<size_t>(cut));
    std::string doc = model.detokenize(tokens);
    const auto back = model.tokenize(doc, false);
    if (static_cast<int32_t>(back.size()) == n_tokens) return doc;
    if (static_cast<int32_t>(back.size()) < n_tokens) break;
  }
  throw Error(ErrorCode::kInternal,
              fmt::format("cannot build a synthetic document of exactly {} tokens", n_tokens));
}

}  // namespace swarmkv
