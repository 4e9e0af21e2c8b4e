// The reference every fork-equivalence test compares with: a fresh context's
// greedy continuation, one-row steps, with the margin of each choice.
#pragma once

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "swarmkv/engine.h"

namespace swarmkv::test {

struct GreedyReference {
  std::vector<Token> tokens;   // the answer, as GenerationTracker keeps it
  std::vector<Token> choices;  // every argmax (EOG included)
  std::vector<float> margins;  // top1 - top2 logit per choice
  std::string text;            // the answer's text
};

// Continues sequence 0 of `ctx`, whose last decode left the logits of the
// token before `pos`, by greedy argmax under `options`' stop rules.
inline GreedyReference greedy_continuation(Context& ctx, Pos pos, const GenerateOptions& options) {
  GenerationTracker tracker(ctx.model(), options);
  GreedyReference ref;
  Batch batch(1);
  for (;;) {
    const std::span<const float> logits = ctx.logits(-1);
    std::vector<float> sorted(logits.begin(), logits.end());
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    const auto best =
        static_cast<Token>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    ref.choices.push_back(best);
    ref.margins.push_back(sorted[0] - sorted[1]);
    if (tracker.accept(best)) break;
    batch.clear();
    batch.add(best, pos++, 0, true);
    ctx.decode(batch);
  }
  Generation answer = tracker.take();
  ref.tokens = std::move(answer.tokens);
  ref.text = std::move(answer.text);
  return ref;
}

}  // namespace swarmkv::test
