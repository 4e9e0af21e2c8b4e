// The seed's synthetic document, for benchmarks and tests.
#pragma once

#include <cstdint>
#include <string>

#include "swarmkv/engine.h"

namespace swarmkv {

// "The quick brown fox jumps over the lazy dog. " repeated and cut so that
// `model` tokenises the text (without special tokens) to exactly `n_tokens`
// tokens, checked by re-tokenising. Throws Error(kInvalidArgument) for
// n_tokens < 1 and Error(kInternal) when no cut gives exactly n_tokens.
std::string synthetic_document(const Model& model, int32_t n_tokens);

}  // namespace swarmkv
