// Token-by-token generation on one sequence, written against the engine API
// only (no llama.h here).
#include <algorithm>

#include <fmt/format.h>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv {

std::string_view to_string(StopReason reason) noexcept {
  switch (reason) {
    case StopReason::kEndOfGeneration:
      return "eog";
    case StopReason::kMaxTokens:
      return "max_tokens";
    case StopReason::kStopString:
      return "stop_string";
  }
  return "unknown";
}

namespace {

// If a stop string occurs in `text` in a match that ends in the newly
// appended bytes (from `old_size` on), cuts the text where the earliest such
// match starts and returns true. A stop string may span several tokens.
bool trim_stop(std::string& text, size_t old_size, const std::vector<std::string>& stops) {
  size_t cut = std::string::npos;
  for (const std::string& stop : stops) {
    if (stop.empty()) continue;
    const size_t from = old_size >= stop.size() - 1 ? old_size - (stop.size() - 1) : 0;
    const size_t at = text.find(stop, from);
    if (at != std::string::npos) cut = std::min(cut, at);
  }
  if (cut == std::string::npos) return false;
  text.resize(cut);
  return true;
}

}  // namespace

GenerationTracker::GenerationTracker(const Model& model, const GenerateOptions& options)
    : model_(&model), options_(options) {
  if (options.max_tokens < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("max_tokens must be >= 1 (got {})", options.max_tokens));
  }
}

bool GenerationTracker::accept(Token token, const SampledLogprobs* logprobs) {
  if (done_) return true;
  if (model_->is_eog(token)) {
    out_.stop_reason = StopReason::kEndOfGeneration;
    return done_ = true;
  }
  out_.tokens.push_back(token);
  if (logprobs != nullptr) out_.logprobs.push_back(*logprobs);
  const size_t old_size = out_.text.size();
  out_.text += model_->token_to_piece(token);
  if (trim_stop(out_.text, old_size, options_.stop)) {
    out_.stop_reason = StopReason::kStopString;
    done_ = true;
  } else if (static_cast<int32_t>(out_.tokens.size()) >= options_.max_tokens) {
    out_.stop_reason = StopReason::kMaxTokens;
    done_ = true;
  }
  if (options_.on_token) options_.on_token(token, out_.text);
  return done_;
}

Generation generate(Context& ctx, Sampler& sampler, SeqId seq, Pos next_pos,
                    const GenerateOptions& options, int32_t first_row) {
  GenerationTracker tracker(ctx.model(), options);
  int32_t row = first_row;
  for (;;) {
    const Token token = sampler.sample(ctx, row);
    if (tracker.accept(token, sampler.kept_logprobs())) break;
    if (static_cast<uint32_t>(next_pos) >= ctx.options().n_ctx) {
      throw Error(ErrorCode::kBudget,
                  fmt::format("generate: sequence {} reached n_ctx {} after {} generated tokens",
                              seq, ctx.options().n_ctx, tracker.n_tokens()));
    }
    const BatchToken next{.token = token, .pos = next_pos++, .seq = seq, .logits = true};
    ctx.decode(std::span(&next, 1));
    row = -1;
  }
  return tracker.take();
}

}  // namespace swarmkv
