// ForkMode::kShared: one unified-KV context holds the document once, on
// sequence 0 (its state restored from a snapshot or from a prefill's export,
// prefix_source.h); every branch is another sequence of it. Forking is
// llama_memory_seq_cp(0, branch): the branch's id joins the prefix cells, no
// KV byte is copied. The calling thread is the only one that touches the
// context: it restores the document, then runs the BatchPlanner's steps
// (continuous batching: one generated token per generating branch plus the
// prompts of newly admitted branches, in one llama_decode per step) until
// every agent has an outcome. A finished branch frees its cells (seq_rm) and
// its id; its dependents are admitted before the next step.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "kv/sequence_table.h"
#include "kv/step_executor.h"
#include "pipeline/batch_planner.h"
#include "pipeline/fork_strategy.h"
#include "prefix/prefix_source.h"
#include "swarmkv/log.h"

namespace swarmkv::detail {
namespace {

// A live branch's engine side; the planner keeps its bookkeeping.
struct Branch {
  StepSequence step;  // its prompt (branch_tokens()), next token, sampler and tracker
  bool generating = false;
  Clock::time_point admitted, first_token;
};

// The branches' steps on the shared context until every agent has an
// outcome: the BatchPlanner admits and plans, the StepExecutor decodes and
// samples, the rest here is what a token means to an agent's result.
class BranchSteps {
 public:
  BranchSteps(const RunInputs& in, Context& ctx, ReadySet& dag, PipelineResult& result,
              bool streaming);
  void run();

 private:
  static std::vector<std::optional<size_t>> parents_of(const PipelineSpec& spec);
  int32_t branch_seqs() const;
  void start(const BatchPlanner::Admission& admitted);
  void step(BatchPlan plan, const std::vector<size_t>& live);
  void decode_failed(const ErrorValue& error, const BatchPlan& plan,
                     const std::vector<size_t>& live);
  bool decoded(const BatchPlan& plan, double ms);
  void sampled(size_t agent, Token token, bool done);
  // The branch's own cells go with its id (take_freed); the document keeps sequence 0.
  void fail(size_t agent, const ErrorValue& error) { planner_.fail(agent, error); }

  const RunInputs& in_;
  Context& ctx_;
  ReadySet& dag_;
  PipelineResult& result_;
  const bool keep_cells_;  // the last id parks finished branches' cells (BranchDecoding)
  ContextKv kv_;
  SequenceTable table_;
  BatchPlanner planner_;
  ContextStepDecoder decoder_;
  StepExecutor executor_;
  std::vector<Branch> branches_;
  StepSequence document_;  // the prefix, owner n of the steps that stream it
  const Stopwatch stream_time_;
  size_t streamed_ = 0;           // document tokens decoded by the branch steps
  Clock::time_point decoded_at_;  // when the last step's decode ended
};

BranchSteps::BranchSteps(const RunInputs& in, Context& ctx, ReadySet& dag, PipelineResult& result,
                         bool streaming)
    : in_(in),
      ctx_(ctx),
      dag_(dag),
      result_(result),
      keep_cells_(branch_decoding(in.spec).keep_cells),
      kv_(ctx),
      table_(kv_, branch_seqs(), keep_cells_),
      planner_(dag, in.prepared.budgeted_prompt_tokens, in.branch_pos0, branch_seqs(),
               static_cast<int32_t>(ctx.options().n_batch), in.spec.max_live, parents_of(in.spec)),
      decoder_(ctx),
      executor_(decoder_, table_),
      branches_(in.spec.agents.size()) {
  const std::vector<Token>& prefix = in.prepared.prefix;
  if (!streaming) table_.decoded(0, prefix.size());  // restored on sequence 0
  if (in.spec.any_needs()) planner_.set_watermarks(in.prepared.watermarks);
  if (streaming) {
    planner_.stream_prefix(static_cast<int32_t>(prefix.size()));
    document_.tokens = prefix;
  }
}

std::vector<std::optional<size_t>> BranchSteps::parents_of(const PipelineSpec& spec) {
  std::vector<std::optional<size_t>> parents(spec.agents.size());
  for (size_t a = 0; a < spec.agents.size(); ++a) {
    if (!spec.agents[a].fork_from.empty()) parents[a] = spec.agent_index(spec.agents[a].fork_from);
  }
  return parents;
}

int32_t BranchSteps::branch_seqs() const {
  const auto n_seq = static_cast<int32_t>(ctx_.options().n_seq_max);
  return keep_cells_ ? n_seq - 1 : n_seq;
}

void BranchSteps::run() {
  while (!planner_.finished()) {
    const std::vector<BatchPlanner::Admission> admissions = planner_.admit();
    for (const SeqId seq : planner_.take_freed()) table_.free(seq);  // before any fork into it
    for (const BatchPlanner::Admission& admitted : admissions) start(admitted);
    const std::vector<size_t> live = planner_.live();
    BatchPlan plan = planner_.next();
    if (!plan.tokens.empty()) {
      step(std::move(plan), live);
    } else if (live.empty() && admissions.empty() && !planner_.finished()) {
      throw Error(ErrorCode::kInternal, dag_.has_ready()
                                            ? "shared fork: ready agents but no sequence id free"
                                            : "shared fork: agents left that can never be ready");
    }
  }
  result_.kv_cells_peak = static_cast<int64_t>(in_.prepared.prefix.size()) +
                          (keep_cells_ ? planner_.decoded_cells() : planner_.peak_cells());
}

void BranchSteps::start(const BatchPlanner::Admission& admitted) {
  Branch& b = branches_[admitted.agent];
  const AgentSpec& spec = in_.spec.agents[admitted.agent];
  b.admitted = Clock::now();
  AgentTimings& t = result_.agents[admitted.agent].timings_ms;
  t.wait = ms_between(dag_.ready_at(admitted.agent + 1), b.admitted);
  t.started_at = ms_between(in_.started, b.admitted);
  try {
    report_started(in_, admitted.agent);
    std::vector<Token> prompt = branch_tokens(in_, admitted.agent, result_);
    // A fork_from child starts after its parent's last decoded token.
    const size_t skip =
        admitted.from == 0 ? 0 : static_cast<size_t>(admitted.pos0 - in_.branch_pos0);
    if (skip >= prompt.size()) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("shared fork: agent '{}' starts at {} of its {} branch tokens",
                              spec.name, skip, prompt.size()));
    }
    prompt.erase(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(skip));
    planner_.set_prompt(admitted.agent, static_cast<int32_t>(prompt.size()));
    b.step.tokens = std::move(prompt);
    GenerateOptions gen;
    gen.max_tokens = spec.max_tokens;
    gen.stop = spec.stop;
    gen.on_token = branch_token_callback(in_, admitted.agent, result_);
    b.step.start(ctx_.model(), spec.sampling, gen);
    // The fork: no KV byte moves. A watermark agent takes the prefix's
    // cells before its watermark only.
    const bool cut = spec.needs.any();
    table_.fork(admitted.seq, admitted.from,
                cut ? static_cast<size_t>(admitted.pos0) : table_.length(admitted.from));
    t.fork = ms_between(b.admitted, Clock::now());
  } catch (...) {
    fail(admitted.agent, current_error_value());
  }
}

void BranchSteps::step(BatchPlan plan, const std::vector<size_t>& live) {
  const size_t n = branches_.size();
  std::vector<StepToken> tokens;
  tokens.reserve(plan.tokens.size());
  for (const PlannedToken& p : plan.tokens) {
    tokens.push_back({.owner = p.document ? n : p.agent,
                      .seq = p.seq,
                      .pos = p.pos,
                      .prompt_index = p.prompt_index,
                      .logits = p.logits});
  }
  StepExecutor::Callbacks on;
  on.failed = [&](std::span<const size_t>, const ErrorValue& error) {
    decode_failed(error, plan, live);
  };
  on.decoded = [&](double ms) { return decoded(plan, ms); };
  on.sampled = [&](size_t agent, Token token, bool done) { sampled(agent, token, done); };
  on.sample_failed = [&](size_t agent, const ErrorValue& error) { fail(agent, error); };
  executor_.run(
      tokens, [&](size_t owner) { return owner == n ? &document_ : &branches_[owner].step; }, on,
      live);  // admission order, as the planner keeps it
}

void BranchSteps::decode_failed(const ErrorValue& error, const BatchPlan& plan,
                                const std::vector<size_t>& live) {
  // The batch mixes every live branch: the failure is theirs together.
  if (plan.step.document_tokens > 0) {  // the prefix can go no further: nobody can run
    log_error("shared fork: a streaming prefill step failed ({}); failing every agent",
              error.to_string());
    planner_.fail_all(error);
    return;
  }
  log_error("shared fork: a decode step of {} branches failed ({}); failing them all", live.size(),
            error.to_string());
  for (const size_t agent : live) fail(agent, error);
}

// After a successful decode: the planner's and the result's bookkeeping;
// false when the streamed prefill's progress callback threw.
bool BranchSteps::decoded(const BatchPlan& plan, double ms) {
  const auto now = Clock::now();
  planner_.decoded(plan);
  const std::vector<Token>& prefix = in_.prepared.prefix;
  if (plan.step.document_tokens > 0 && in_.options.on_prefill_progress) {
    streamed_ += static_cast<size_t>(plan.step.document_tokens);
    try {
      in_.options.on_prefill_progress(streamed_, prefix.size());
    } catch (...) {  // as a failed prefill: nobody can run
      const ErrorValue error = current_error_value();
      log_error("shared fork: the prefill's progress callback threw ({}); failing every agent",
                error.to_string());
      planner_.fail_all(error);
      return false;
    }
  }
  if (plan.step.document_tokens > 0 && !planner_.streaming()) {
    result_.prefill_ms = stream_time_.ms();
    result_.prefill_done_at_ms = ms_between(in_.started, now);
    result_.kv_bytes_per_cell =
        static_cast<double>(ctx_.state_seq_size(0)) / static_cast<double>(prefix.size());
    log_info("prefix: {} tokens prefilled in {:.1f} ms, streamed with the agents' steps",
             prefix.size(), result_.prefill_ms);
    // The next run restores the document instead of streaming it again.
    if (result_.snapshot && publish_streamed_prefix(ctx_, in_.spec, prefix, in_.options.snapshot,
                                                    *result_.snapshot, result_.export_ms)) {
      result_.snapshot_bytes = result_.snapshot->bytes;
    }
  }
  DecodeStep step = plan.step;
  step.ms = ms;
  result_.decode_steps.push_back(step);
  decoded_at_ = now;
  return true;
}

void BranchSteps::sampled(size_t agent, Token, bool done) {
  Branch& b = branches_[agent];
  const auto now = Clock::now();
  AgentTimings& t = result_.agents[agent].timings_ms;
  if (!b.generating) {
    t.prompt = ms_between(b.admitted, decoded_at_);
    t.first_token_at = ms_between(in_.started, now);
    b.first_token = now;
    b.generating = true;
  }
  if (!done) {
    planner_.sampled(agent, false);
    return;
  }
  AgentResult& out = result_.agents[agent];
  Generation answer = b.step.tracker->take();
  out.answer = std::move(answer.text);
  out.tokens = std::move(answer.tokens);
  out.logprobs = std::move(answer.logprobs);
  out.stop_reason = answer.stop_reason;
  t.first_token = ms_between(b.admitted, b.first_token);
  t.generate = ms_between(b.first_token, now);
  t.total = ms_between(b.admitted, now);
  t.done_at = ms_between(in_.started, now);
  b.step.release();
  try {
    settle_structured_answer(in_.spec.agents[agent], out);
  } catch (...) {
    fail(agent, current_error_value());
    return;
  }
  // After the result is written: the outcome is reported from here.
  planner_.sampled(agent, true);  // its id and cells freed, or parked for its children
}

class SharedFork final : public ForkStrategy {
 public:
  PipelineBudget budget(int32_t prefix_tokens, const std::vector<int32_t>& prompt_tokens,
                        const std::vector<int32_t>& max_tokens, uint32_t n_ctx) const override {
    return budget_one_shared_context(prefix_tokens, prompt_tokens, max_tokens, n_ctx);
  }

  void run(const RunInputs& in, ReadySet& dag, PipelineResult& result) override {
    const size_t document = *dag.pop();
    // Agents that read part of the document start during its prefill, so
    // the shared context prefills it itself, unless a snapshot holds it all.
    const bool stream_if_missing = in.options.snapshot.file.empty() && in.spec.any_needs();
    std::unique_ptr<Context> ctx;
    bool streaming = false;
    try {
      ctx = prefill(in, result, stream_if_missing, streaming);
    } catch (...) {
      dag.fail(document, current_error_value());
      return;
    }
    if (!streaming) result.prefill_done_at_ms = ms_between(in.started, Clock::now());
    dag.succeed(document);  // streaming: a failed prefill step fails every agent instead
    BranchSteps(in, *ctx, dag, result, streaming).run();
  }

 private:
  // The shared context with the prefix restored on sequence 0, or, when
  // `stream_if_missing` and no snapshot holds exactly this prefix, empty
  // (`streaming` set: the branch steps decode the prefix too).
  static std::unique_ptr<Context> prefill(const RunInputs& in, PipelineResult& result,
                                          bool stream_if_missing, bool& streaming) {
    const std::vector<Token>& prefix = in.prepared.prefix;
    PrefixState state = obtain_prefix_state(in.spec, prefix, in.options.snapshot,
                                            in.options.on_prefill_progress, in.model,
                                            /*exact_only=*/stream_if_missing);
    streaming = state.bytes.empty();
    // Where the prefix came from, also when its restore fails below (a
    // store entry that fails is removed by name: run_pipeline).
    result.snapshot = state.use;
    ContextOptions options = in.spec.context_options();
    options.n_ctx = in.prepared.budget.n_ctx;
    options.kv_unified = true;
    options.n_seq_max = in.prepared.budget.n_seq_max;
    options.n_batch = std::max(in.spec.n_batch, options.n_seq_max);  // room for every live branch
    const BranchDecoding decoding = branch_decoding(in.spec);
    if (decoding.keep_cells)  // one more id: the park sequence
      options.n_seq_max = std::min(options.n_seq_max + 1, max_parallel_sequences());
    options.n_ubatch = stream_if_missing && state.bytes.empty() ? in.spec.context_options().n_ubatch
                       : decoding.max_rows > 0 ? std::min(options.n_batch, decoding.max_rows)
                                               : options.n_batch;
    auto ctx = std::make_unique<Context>(in.model, options);
    const Stopwatch r;
    if (!streaming) {
      // The prefix on sequence 0, each cell at its index.
      restore_prefix(*ctx, state.bytes, prefix.size(), state.use.path);
    }
    result.restore_ms = r.ms();
    result.prefill_ms = state.prefill_ms;
    result.export_ms = state.export_ms;
    result.document_prefills = state.use.prefilled_tokens > 0 ? 1 : 0;
    result.snapshot_bytes = state.bytes.size();
    result.n_ctx = ctx->options().n_ctx;
    result.n_seq_max = ctx->options().n_seq_max;
    result.contexts = 1;
    result.kv_bytes_per_cell =
        static_cast<double>(state.bytes.size()) / static_cast<double>(prefix.size());
    if (streaming) {
      result.document_prefills = 1;
      log_info(
          "prefix: {} tokens in a shared context (n_ctx {}, n_seq_max {}), prefilled there as "
          "agents start (streaming)",
          prefix.size(), result.n_ctx, result.n_seq_max);
      return ctx;
    }
    log_info(
        "prefix: {} tokens in a shared context (n_ctx {}, n_seq_max {}), restored in {:.1f} ms",
        prefix.size(), result.n_ctx, result.n_seq_max, result.restore_ms);
    return ctx;
  }
};

}  // namespace

std::unique_ptr<ForkStrategy> make_shared_fork() {
  return std::make_unique<SharedFork>();
}

}  // namespace swarmkv::detail
