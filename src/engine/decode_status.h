// Internal: the mapping of llama_decode's return codes to swarmkv::Error.
// Declared here (without llama.h) so unit tests can check every code.
#pragma once

#include <cstdint>

#include "swarmkv/engine.h"

namespace swarmkv::detail {

// Returns normally for rc == 0; throws Error otherwise:
//   1 -> kNoKvSlot, 2 -> kAborted, -1 -> kInvalidBatch, < -1 -> kDecodeFatal,
//   other positive codes -> kInternal. Messages name n_tokens, n_ctx, n_seq_max.
void check_decode(int32_t rc, int32_t n_tokens, const ContextOptions& options);

}  // namespace swarmkv::detail
