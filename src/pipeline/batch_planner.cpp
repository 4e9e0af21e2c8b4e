#include "pipeline/batch_planner.h"

#include <algorithm>
#include <limits>
#include <utility>

#include <fmt/format.h>

#include "kv/step_composer.h"

namespace swarmkv::detail {
namespace {

// The streamed prefix's tokens in a composed step (they belong to no agent).
constexpr size_t kDocument = std::numeric_limits<size_t>::max();

}  // namespace

BatchPlanner::BatchPlanner(ReadySet& dag, std::vector<int32_t> prompt_tokens, Pos pos0,
                           int32_t n_seq_max, int32_t n_batch, int32_t max_live,
                           std::vector<std::optional<size_t>> fork_from)
    : dag_(dag),
      prompt_tokens_(std::move(prompt_tokens)),
      pos0_(pos0),
      n_batch_(n_batch),
      max_live_(
          static_cast<size_t>(max_live > 0 ? std::min(max_live, n_seq_max - 1) : n_seq_max - 1)),
      fork_from_(std::move(fork_from)) {
  if (fork_from_.empty()) fork_from_.resize(prompt_tokens_.size());
  if (fork_from_.size() != prompt_tokens_.size()) {
    throw Error(ErrorCode::kInternal, "batch planner: one fork_from entry per agent expected");
  }
  if (max_live < 0) throw Error(ErrorCode::kInternal, "batch planner: max_live < 0");
  if (n_seq_max < 2) {
    throw Error(ErrorCode::kInternal, "the shared fork needs n_seq_max >= 2 (prefix + 1 branch)");
  }
  if (n_batch < n_seq_max) {
    throw Error(
        ErrorCode::kInternal,
        fmt::format("the shared fork needs n_batch {} >= n_seq_max {}", n_batch, n_seq_max));
  }
  if (dag_.size() != prompt_tokens_.size() + 1) {
    throw Error(ErrorCode::kInternal, "batch planner: one DAG node per agent plus the document");
  }
  for (SeqId s = n_seq_max - 1; s >= 1; --s) free_seqs_.push_back(s);
}

std::vector<BatchPlanner::Admission> BatchPlanner::admit() {
  std::erase_if(parked_, [&](const Branch& p) {
    for (size_t c = 0; c < fork_from_.size(); ++c) {
      if (fork_from_[c] == p.agent && !dag_.started(c + 1)) return false;
    }
    free_seqs_.push_back(p.seq);
    freed_.push_back(p.seq);
    cells_ -= p.cells;
    return true;
  });
  std::vector<Admission> admitted;
  const auto watermark = [&](size_t agent) {
    return watermarks_.empty() ? pos0_ : watermarks_[agent];
  };
  // A ready agent waits until the prefix it reads is decoded.
  const auto readable = [&](size_t node) {
    return node > 0 && (prefix_decoded_ >= prefix_total_ || watermark(node - 1) <= prefix_decoded_);
  };
  while (!free_seqs_.empty() && live_.size() < max_live_) {
    const std::optional<size_t> node = dag_.pop_if(readable);
    if (!node) break;
    Branch b;
    b.agent = *node - 1;
    b.seq = free_seqs_.back();
    b.pos0 = watermark(b.agent);
    free_seqs_.pop_back();
    SeqId from = 0;
    if (const std::optional<size_t> parent = fork_from_.at(b.agent)) {
      const auto p = std::find_if(parked_.begin(), parked_.end(),
                                  [&](const Branch& x) { return x.agent == *parent; });
      if (p == parked_.end()) {
        throw Error(
            ErrorCode::kInternal,
            fmt::format("batch planner: agent #{}'s parent #{} is not parked", b.agent, *parent));
      }
      from = p->seq;
      b.pos0 = p->pos0;
    }
    live_.push_back(b);
    admitted.push_back({b.agent, b.seq, from, b.pos0});
  }
  return admitted;
}

std::vector<SeqId> BatchPlanner::take_freed() {
  return std::exchange(freed_, {});
}

bool BatchPlanner::has_children(size_t agent) const {
  return std::any_of(fork_from_.begin(), fork_from_.end(),
                     [&](const std::optional<size_t>& p) { return p == agent; });
}

void BatchPlanner::set_prompt(size_t agent, int32_t tokens) {
  const Branch& b = live_branch(agent);
  if (b.fed > 0 || tokens < 1) {
    throw Error(ErrorCode::kInternal,
                fmt::format("batch planner: agent #{} cannot take a prompt of {} tokens now", agent,
                            tokens));
  }
  prompt_tokens_.at(agent) = tokens;
}

void BatchPlanner::set_watermarks(std::vector<Pos> watermarks) {
  if (watermarks.size() != prompt_tokens_.size()) {
    throw Error(ErrorCode::kInternal, "batch planner: one watermark per agent expected");
  }
  watermarks_ = std::move(watermarks);
}

void BatchPlanner::stream_prefix(int32_t tokens) {
  prefix_total_ = tokens;
  prefix_planned_ = 0;
  prefix_decoded_ = 0;
}

void BatchPlanner::fail_all(const ErrorValue& error) {
  for (const size_t agent : live()) fail(agent, error);
  while (const std::optional<size_t> node = dag_.pop()) dag_.fail(*node, error);
}

BatchPlan BatchPlanner::next() {
  BatchPlan plan;
  StepComposer step(n_batch_);
  for (const Branch& b : live_) {
    if (b.generating &&
        step.generating(b.agent, b.seq, b.pos0 + prompt_tokens_[b.agent] + b.generated - 1)) {
      ++plan.step.generate_tokens;
    }
  }
  plan.step.branches = plan.step.generate_tokens;
  for (Branch& b : live_) {
    const int32_t n = prompt_tokens_[b.agent];
    if (b.generating || b.fed == n) continue;
    if (step.has_room()) ++plan.step.branches;
    const int32_t added = step.prefill(b.agent, b.seq, b.pos0, b.fed, n, n - 1);
    b.fed += added;
    plan.step.prompt_tokens += added;
  }
  // The streamed prefix takes the room left, unless no agent is left to read it.
  if (prefix_planned_ < prefix_total_ && !dag_.finished()) {
    const int32_t added = step.prefill(kDocument, 0, 0, prefix_planned_, prefix_total_, -1);
    prefix_planned_ += added;
    plan.step.document_tokens += added;
  }
  plan.tokens.reserve(step.tokens().size());
  for (const StepToken& t : step.tokens()) {
    const bool document = t.owner == kDocument;
    plan.tokens.push_back(
        {document ? 0 : t.owner, t.seq, t.pos, t.prompt_index, t.logits, document});
  }
  return plan;
}

void BatchPlanner::decoded(const BatchPlan& plan) {
  for (const PlannedToken& t : plan.tokens) {
    if (t.document) {
      prefix_decoded_ = std::max(prefix_decoded_, t.pos + 1);
      continue;
    }
    ++live_branch(t.agent).cells;
    ++cells_;
    ++decoded_cells_;
  }
  peak_cells_ = std::max(peak_cells_, cells_);
}

void BatchPlanner::sampled(size_t agent, bool done) {
  Branch& b = live_branch(agent);
  b.generating = true;
  ++b.generated;
  if (!done) return;
  if (has_children(agent)) {
    Branch parked = b;
    parked.pos0 = b.pos0 + prompt_tokens_[agent] + b.generated - 1;  // its last token: undecoded
    parked_.push_back(parked);
    std::erase_if(live_, [&](const Branch& x) { return x.agent == agent; });
  } else {
    release(agent);
  }
  dag_.succeed(agent + 1);
}

void BatchPlanner::fail(size_t agent, const ErrorValue& error) {
  release(agent);
  dag_.fail(agent + 1, error);
}

std::vector<size_t> BatchPlanner::live() const {
  std::vector<size_t> out;
  for (const Branch& b : live_) out.push_back(b.agent);
  return out;
}

BatchPlanner::Branch& BatchPlanner::live_branch(size_t agent) {
  const auto it =
      std::find_if(live_.begin(), live_.end(), [&](const Branch& b) { return b.agent == agent; });
  if (it == live_.end()) {
    throw Error(ErrorCode::kInternal, fmt::format("batch planner: agent #{} is not live", agent));
  }
  return *it;
}

void BatchPlanner::release(size_t agent) {
  const Branch& b = live_branch(agent);
  free_seqs_.push_back(b.seq);
  freed_.push_back(b.seq);
  cells_ -= b.cells;
  std::erase_if(live_, [&](const Branch& x) { return x.agent == agent; });
}

}  // namespace swarmkv::detail
