#include "kv/step_composer.h"

#include <fmt/format.h>

#include "swarmkv/error.h"

namespace swarmkv::detail {

StepComposer::StepComposer(int32_t capacity) : capacity_(capacity) {
  if (capacity < 1) {
    throw Error(ErrorCode::kInternal, fmt::format("step composer: capacity {}", capacity));
  }
  tokens_.reserve(static_cast<size_t>(capacity));
}

bool StepComposer::generating(size_t owner, SeqId seq, Pos pos) {
  if (prompts_started_) {
    throw Error(ErrorCode::kInternal,
                "step composer: a generated token after prompt tokens (they come first)");
  }
  if (!has_room()) return false;
  tokens_.push_back({owner, seq, pos, -1, true, false});
  return true;
}

int32_t StepComposer::prefill(size_t owner, SeqId seq, Pos pos0, int32_t next, int32_t end,
                              int32_t logits_at, int32_t score_until) {
  prompts_started_ = true;
  int32_t added = 0;
  for (int32_t i = next; i < end && has_room(); ++i, ++added) {
    tokens_.push_back({owner, seq, pos0 + i, i, i == logits_at, i < score_until && i != logits_at});
  }
  return added;
}

}  // namespace swarmkv::detail
