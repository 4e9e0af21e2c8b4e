#include "kv/step_executor.h"

#include <algorithm>

#include <fmt/format.h>

#include "swarmkv/measure.h"

namespace swarmkv::detail {

void StepSequence::start(const Model& model, const SamplingOptions& sampling,
                         const GenerateOptions& gen) {
  sampler = std::make_unique<Sampler>(model, sampling);
  tracker = std::make_unique<GenerationTracker>(model, gen);
}

void StepSequence::release() {
  tokens = {};
  sampler.reset();
  tracker.reset();
  prompt_scores.reset();
}

bool StepExecutor::run(std::span<const StepToken> plan, const Owners& owners,
                       const Callbacks& callbacks, std::span<const size_t> order) {
  inputs_.clear();
  rows_.clear();
  scored_.clear();
  in_step_.clear();
  for (const StepToken& t : plan) {
    const StepSequence* s = owners(t.owner);
    if (s == nullptr) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("step: a planned token of owner {} that has no sequence", t.owner));
    }
    const Token token =
        t.prompt_index >= 0 ? s->tokens.at(static_cast<size_t>(t.prompt_index)) : s->next;
    if (t.logits) rows_.emplace_back(t.owner, static_cast<int32_t>(inputs_.size()));
    if (t.score) {
      if (t.prompt_index < 0 || static_cast<size_t>(t.prompt_index) + 1 >= s->tokens.size() ||
          !s->prompt_scores) {
        throw Error(ErrorCode::kInternal,
                    fmt::format("step: owner {} scores after prompt token {} of {}{}", t.owner,
                                t.prompt_index, s->tokens.size(),
                                s->prompt_scores ? "" : " without a place for the scores"));
      }
      scored_.emplace_back(&t, static_cast<int32_t>(inputs_.size()));
    }
    inputs_.push_back({.token = token, .pos = t.pos, .seq = t.seq, .logits = t.logits || t.score});
    if (std::find(in_step_.begin(), in_step_.end(), t.owner) == in_step_.end())
      in_step_.push_back(t.owner);
  }
  const Stopwatch decode;
  try {
    decoder_.decode(inputs_);
  } catch (...) {
    callbacks.failed(in_step_, current_error_value());
    return false;
  }
  const double ms = decode.ms();
  for (const StepToken& t : plan) table_.decoded(t.seq, 1);
  if (callbacks.decoded && !callbacks.decoded(ms)) return false;

  // A prompt token's score, at the row of the token before it.
  std::vector<size_t> failed;
  for (const auto& [t, row] : scored_) {
    StepSequence* s = owners(t->owner);
    if (s == nullptr || std::find(failed.begin(), failed.end(), t->owner) != failed.end()) {
      continue;
    }
    try {
      const Token next = s->tokens.at(static_cast<size_t>(t->prompt_index) + 1);
      s->prompt_scores->push_back(decoder_.score(row, next, s->score_top));
    } catch (...) {
      failed.push_back(t->owner);
      callbacks.sample_failed(t->owner, current_error_value());
    }
  }
  const auto sample_row = [&](size_t owner, int32_t row) {
    StepSequence* s = owners(owner);
    if (s == nullptr || std::find(failed.begin(), failed.end(), owner) != failed.end()) return;
    Token token = -1;
    bool done = false;
    try {
      token = decoder_.sample(*s, row);
      done = decoder_.accept(*s, token);
    } catch (...) {
      callbacks.sample_failed(owner, current_error_value());
      return;
    }
    if (!done) s->next = token;
    callbacks.sampled(owner, token, done);
  };
  if (order.empty()) {
    for (const auto& [owner, row] : rows_) sample_row(owner, row);
    return true;
  }
  row_of_.clear();
  for (const auto& [owner, row] : rows_) row_of_[owner] = row;
  for (const size_t owner : order) {
    if (const auto it = row_of_.find(owner); it != row_of_.end()) sample_row(owner, it->second);
  }
  return true;
}

}  // namespace swarmkv::detail
