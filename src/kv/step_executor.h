// One generation step for every front-end that batches several sequences
// on one context: the shared fork's branches (and its streamed document)
// and `serve`'s completions. A StepComposer-shaped plan is decoded in one
// call (Context::decode, the one place the library fills a llama_batch),
// its cells recorded in the SequenceTable, each logits row sampled for its
// owner and handed back through callbacks. The front-ends keep only what differs:
// which sequences run (the pipeline's BatchPlanner, the server's
// scheduler) and what a sampled token means to them (a result, an event).
// Pure over a StepDecoder (a Context in the engine, a scripted fake in the
// unit tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/sequence_table.h"
#include "kv/step_composer.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv::detail {

// What one owner of planned tokens (a branch, a completion, the document)
// decodes and samples with.
struct StepSequence {
  // The tokens a StepToken's prompt_index counts in: its prompt (the server
  // appends each generated token once decoded).
  std::vector<Token> tokens;
  Token next = -1;  // the last sampled token, decoded in the next step
  // The engine side (ContextStepDecoder); unset for an owner without logits.
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<GenerationTracker> tracker;
  // Set: each prompt token a step scores (StepToken::score) is appended here
  // (StepDecoder::score), the `score_top` likeliest tokens beside it.
  std::shared_ptr<std::vector<SampledLogprobs>> prompt_scores;
  int32_t score_top = 0;

  // A sampler and a tracker for a new answer.
  void start(const Model& model, const SamplingOptions& sampling, const GenerateOptions& gen);
  // Drops the prompt, the sampler and the tracker (an outcome was written).
  void release();
};

// The engine operations a step issues.
class StepDecoder {
 public:
  virtual ~StepDecoder() = default;
  // One llama_decode of `batch`; throws Error.
  virtual void decode(std::span<const BatchToken> batch) = 0;
  // Samples output row `row` of the last decode for `s` (its sampler).
  virtual Token sample(StepSequence& s, int32_t row) = 0;
  // Records `token` in `s`'s answer: true when the answer is complete.
  virtual bool accept(StepSequence& s, Token token) = 0;
  // `token`'s log probability at output row `row` of the last decode, the
  // `top` likeliest tokens' beside it.
  virtual SampledLogprobs score(int32_t row, Token token, int32_t top) = 0;
};

// StepDecoder on a real context.
class ContextStepDecoder final : public StepDecoder {
 public:
  explicit ContextStepDecoder(Context& ctx) : ctx_(ctx) {}
  void decode(std::span<const BatchToken> batch) override { ctx_.decode(batch); }
  Token sample(StepSequence& s, int32_t row) override { return s.sampler->sample(ctx_, row); }
  bool accept(StepSequence& s, Token token) override {
    return s.tracker->accept(token, s.sampler->kept_logprobs());
  }
  SampledLogprobs score(int32_t row, Token token, int32_t top) override {
    return score_token(ctx_.model(), ctx_, row, token, top);
  }

 private:
  Context& ctx_;
};

class StepExecutor {
 public:
  // The owner of index i's sequence (nullptr: skip its row this step: it
  // failed or left since the plan was made).
  using Owners = std::function<StepSequence*(size_t owner)>;
  struct Callbacks {
    // The decode failed: `owners` (each with a token in the step, in batch
    // order, once) fail together; nothing was recorded.
    std::function<void(std::span<const size_t> owners, const ErrorValue& error)> failed;
    // The decode succeeded (its cells are recorded): `ms` it took. False:
    // sample nothing this step (the caller failed its owners).
    std::function<bool(double ms)> decoded;
    // `owner` sampled `token` from its row; `done`: its answer is complete
    // (the token must not be decoded).
    std::function<void(size_t owner, Token token, bool done)> sampled;
    // Sampling or accepting threw for `owner` alone: the others go on.
    std::function<void(size_t owner, const ErrorValue& error)> sample_failed;
  };

  StepExecutor(StepDecoder& decoder, SequenceTable& table) : decoder_(decoder), table_(table) {}

  // Decodes `plan` (batch order), records one cell per token on its
  // sequence, scores the prompt tokens after its scoring rows (in batch
  // order, into their owners' prompt_scores), then samples each logits
  // row: in `order` (owners without a row skipped) when given, else in
  // batch order. A scoring or sampling failure is the owner's alone
  // (sample_failed; it samples nothing more this step). Returns false when the
  // decode failed (callbacks.failed) or callbacks.decoded said stop.
  bool run(std::span<const StepToken> plan, const Owners& owners, const Callbacks& callbacks,
           std::span<const size_t> order = {});

 private:
  StepDecoder& decoder_;
  SequenceTable& table_;
  std::vector<BatchToken> inputs_;
  std::vector<std::pair<size_t, int32_t>> rows_;              // owner, logits row; batch order
  std::vector<std::pair<const StepToken*, int32_t>> scored_;  // scoring token, its row
  std::unordered_map<size_t, int32_t> row_of_;
  std::vector<size_t> in_step_;
};

}  // namespace swarmkv::detail
