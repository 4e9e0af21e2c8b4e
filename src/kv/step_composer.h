// What one llama_decode carries, for every front-end that batches several
// sequences: the shared fork's planner (pipeline branches) and `serve`'s
// scheduler (HTTP completions) both compose their steps here. Pure: it
// neither decodes nor samples.
//
// A step is one generated token per generating sequence, in the order the
// caller gives them, then prompt tokens of the prefilling sequences in the
// order the caller gives them (admission order), each from its next token
// up to its chunk end, while the step has room. Generated tokens first, so
// that a long prompt never delays an answer in progress; the order is the
// caller's, so the batches (and with them the answers) repeat run to run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "swarmkv/engine.h"

namespace swarmkv::detail {

struct StepToken {
  size_t owner = 0;  // the caller's index of the sequence's owner (a branch, a slot)
  SeqId seq = 0;
  Pos pos = 0;
  int32_t prompt_index = -1;  // the prompt token to decode; -1: the owner's last sampled token
  bool logits = false;        // the owner samples from this token's output row
  bool score = false;         // the owner scores its next prompt token from this token's output row
};

class StepComposer {
 public:
  // `capacity`: the most tokens one step carries (n_batch). Throws
  // Error(kInternal) when it is < 1.
  explicit StepComposer(int32_t capacity);

  // A generating sequence's last sampled token, at `pos`; false (nothing
  // added) when the step is full. Throws Error(kInternal) once a prompt was
  // added: generated tokens come first.
  bool generating(size_t owner, SeqId seq, Pos pos);
  // Prompt tokens `next` .. `end` - 1 of a prefilling sequence, token i at
  // position pos0 + i, as many as fit; the token at `logits_at` (-1: none)
  // has its logits. Each token before `score_until` (-1: none; the prompt's
  // last token when its tokens are scored) other than that one has its
  // output row too, to score the prompt token after it (StepToken::score).
  // Returns how many were added.
  int32_t prefill(size_t owner, SeqId seq, Pos pos0, int32_t next, int32_t end, int32_t logits_at,
                  int32_t score_until = -1);

  bool has_room() const noexcept { return static_cast<int32_t>(tokens_.size()) < capacity_; }
  // In batch order: the logits rows count up in this order.
  const std::vector<StepToken>& tokens() const noexcept { return tokens_; }

 private:
  int32_t capacity_;
  bool prompts_started_ = false;
  std::vector<StepToken> tokens_;
};

}  // namespace swarmkv::detail
