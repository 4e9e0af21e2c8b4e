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
#include <map>
#include <optional>

#include <fmt/format.h>

#include "kv/sequence_table.h"
#include "pipeline/batch_planner.h"
#include "pipeline/fork_strategy.h"
#include "prefix/prefix_source.h"
#include "swarmkv/log.h"

namespace swarmkv::detail {
namespace {

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
    decode_branches(in, *ctx, dag, result, streaming);
  }

 private:
  // A live branch's engine side; the planner keeps its bookkeeping.
  struct Branch {
    SeqId seq = -1;
    std::unique_ptr<Sampler> sampler;
    std::unique_ptr<GenerationTracker> tracker;
    std::vector<Token> prompt;  // branch_tokens()
    Token next = -1;            // sampled, decoded in the next step
    bool generating = false;
    Clock::time_point admitted, first_token;
  };

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
          "agents start (streaming; not published to the snapshot store)",
          prefix.size(), result.n_ctx, result.n_seq_max);
      return ctx;
    }
    log_info(
        "prefix: {} tokens in a shared context (n_ctx {}, n_seq_max {}), restored in {:.1f} ms",
        prefix.size(), result.n_ctx, result.n_seq_max, result.restore_ms);
    return ctx;
  }

  static void decode_branches(const RunInputs& in, Context& ctx, ReadySet& dag,
                              PipelineResult& result, bool streaming) {
    const size_t n = in.spec.agents.size();
    std::vector<std::optional<size_t>> parents(n);
    for (size_t a = 0; a < n; ++a) {
      if (!in.spec.agents[a].fork_from.empty())
        parents[a] = in.spec.agent_index(in.spec.agents[a].fork_from);
    }
    // keep_cells: the last id parks finished branches' cells (see BranchDecoding).
    const bool keep_cells = branch_decoding(in.spec).keep_cells;
    const auto n_seq = static_cast<int32_t>(ctx.options().n_seq_max);
    ContextKv kv(ctx);
    SequenceTable table(kv, keep_cells ? n_seq - 1 : n_seq, keep_cells);
    const std::vector<Token>& prefix = in.prepared.prefix;
    if (!streaming) table.decoded(0, prefix.size());  // restored on sequence 0
    BatchPlanner planner(
        dag, in.prepared.budgeted_prompt_tokens, in.branch_pos0, keep_cells ? n_seq - 1 : n_seq,
        static_cast<int32_t>(ctx.options().n_batch), in.spec.max_live, std::move(parents));
    if (in.spec.any_needs()) planner.set_watermarks(in.prepared.watermarks);
    if (streaming) planner.stream_prefix(static_cast<int32_t>(prefix.size()));
    const Stopwatch stream_time;
    size_t streamed = 0;  // document tokens decoded by the branch steps
    std::vector<Branch> branches(n);
    Batch batch(static_cast<int32_t>(ctx.options().n_batch), 1);
    // The branch's own cells go with its id (take_freed); the document keeps sequence 0.
    const auto fail = [&](size_t agent, const ErrorValue& error) { planner.fail(agent, error); };

    while (!planner.finished()) {
      const std::vector<BatchPlanner::Admission> admissions = planner.admit();
      for (const SeqId seq : planner.take_freed()) table.free(seq);  // before any fork into it
      for (const BatchPlanner::Admission& admitted : admissions) {
        Branch& b = branches[admitted.agent];
        const AgentSpec& spec = in.spec.agents[admitted.agent];
        b.seq = admitted.seq;
        b.admitted = Clock::now();
        AgentTimings& t = result.agents[admitted.agent].timings_ms;
        t.wait = ms_between(dag.ready_at(admitted.agent + 1), b.admitted);
        t.started_at = ms_between(in.started, b.admitted);
        try {
          report_started(in, admitted.agent);
          b.prompt = branch_tokens(in, admitted.agent, result);
          // A fork_from child starts after its parent's last decoded token.
          const size_t skip =
              admitted.from == 0 ? 0 : static_cast<size_t>(admitted.pos0 - in.branch_pos0);
          if (skip >= b.prompt.size()) {
            throw Error(ErrorCode::kInternal,
                        fmt::format("shared fork: agent '{}' starts at {} of its {} branch tokens",
                                    spec.name, skip, b.prompt.size()));
          }
          b.prompt.erase(b.prompt.begin(), b.prompt.begin() + static_cast<std::ptrdiff_t>(skip));
          planner.set_prompt(admitted.agent, static_cast<int32_t>(b.prompt.size()));
          b.sampler = std::make_unique<Sampler>(ctx.model(), spec.sampling);
          GenerateOptions gen;
          gen.max_tokens = spec.max_tokens;
          gen.stop = spec.stop;
          gen.on_token = branch_token_callback(in, admitted.agent, result);
          b.tracker = std::make_unique<GenerationTracker>(ctx.model(), gen);
          // The fork: no KV byte moves. A watermark agent takes the prefix's
          // cells before its watermark only.
          const bool cut = spec.needs.any();
          table.fork(b.seq, admitted.from,
                     cut ? static_cast<size_t>(admitted.pos0) : table.length(admitted.from));
          t.fork = ms_between(b.admitted, Clock::now());
        } catch (...) {
          fail(admitted.agent, current_error_value());
        }
      }
      const std::vector<size_t> live = planner.live();
      BatchPlan plan = planner.next();
      if (plan.tokens.empty()) {
        if (live.empty() && admissions.empty() && !planner.finished()) {
          throw Error(ErrorCode::kInternal,
                      dag.has_ready() ? "shared fork: ready agents but no sequence id free"
                                      : "shared fork: agents left that can never be ready");
        }
        continue;
      }
      batch.clear();
      std::map<size_t, int32_t> rows;  // agent -> its logits row in this batch
      for (const PlannedToken& p : plan.tokens) {
        const Token token = p.document ? prefix[static_cast<size_t>(p.prompt_index)]
                            : p.prompt_index >= 0
                                ? branches[p.agent].prompt[static_cast<size_t>(p.prompt_index)]
                                : branches[p.agent].next;
        if (p.logits) rows[p.agent] = batch.size();
        batch.add(token, p.pos, p.seq, p.logits);
      }

      const auto t0 = Clock::now();
      try {
        ctx.decode(batch);
      } catch (...) {
        // The batch mixes every live branch: the failure is theirs together.
        const ErrorValue error = current_error_value();
        if (plan.step.document_tokens > 0) {  // the prefix can go no further: nobody can run
          log_error("shared fork: a streaming prefill step failed ({}); failing every agent",
                    error.to_string());
          planner.fail_all(error);
          continue;
        }
        log_error("shared fork: a decode step of {} branches failed ({}); failing them all",
                  live.size(), error.to_string());
        for (const size_t agent : live) fail(agent, error);
        continue;
      }
      const auto t1 = Clock::now();
      planner.decoded(plan);
      for (const PlannedToken& p : plan.tokens) table.decoded(p.seq, 1);
      if (plan.step.document_tokens > 0 && in.options.on_prefill_progress) {
        streamed += static_cast<size_t>(plan.step.document_tokens);
        try {
          in.options.on_prefill_progress(streamed, prefix.size());
        } catch (...) {  // as a failed prefill: nobody can run
          const ErrorValue error = current_error_value();
          log_error("shared fork: the prefill's progress callback threw ({}); failing every agent",
                    error.to_string());
          planner.fail_all(error);
          continue;
        }
      }
      if (plan.step.document_tokens > 0 && !planner.streaming()) {
        result.prefill_ms = stream_time.ms();
        result.prefill_done_at_ms = ms_between(in.started, t1);
        result.kv_bytes_per_cell =
            static_cast<double>(ctx.state_seq_size(0)) / static_cast<double>(prefix.size());
        log_info("prefix: {} tokens prefilled in {:.1f} ms, streamed with the agents' steps",
                 prefix.size(), result.prefill_ms);
      }
      plan.step.ms = ms_between(t0, t1);
      result.decode_steps.push_back(plan.step);

      for (const size_t agent : live) {  // admission order, as the planner keeps it
        const auto row = rows.find(agent);
        if (row == rows.end()) continue;
        Branch& b = branches[agent];
        Token token = -1;
        bool done = false;
        try {
          token = b.sampler->sample(ctx, row->second);
          done = b.tracker->accept(token);
        } catch (...) {
          fail(agent, current_error_value());  // this branch only; the others go on
          continue;
        }
        const auto now = Clock::now();
        AgentTimings& t = result.agents[agent].timings_ms;
        if (!b.generating) {
          t.prompt = ms_between(b.admitted, t1);
          t.first_token_at = ms_between(in.started, now);
          b.first_token = now;
          b.generating = true;
        }
        b.next = token;
        if (!done) {
          planner.sampled(agent, false);
          continue;
        }
        AgentResult& out = result.agents[agent];
        Generation answer = b.tracker->take();
        out.answer = std::move(answer.text);
        out.tokens = std::move(answer.tokens);
        out.stop_reason = answer.stop_reason;
        t.first_token = ms_between(b.admitted, b.first_token);
        t.generate = ms_between(b.first_token, now);
        t.total = ms_between(b.admitted, now);
        t.done_at = ms_between(in.started, now);
        b.sampler.reset();
        b.tracker.reset();
        b.prompt = {};
        // After the result is written: the outcome is reported from here.
        planner.sampled(agent, true);  // its id and cells freed, or parked for its children
      }
    }
    result.kv_cells_peak = static_cast<int64_t>(in.prepared.prefix.size()) +
                           (keep_cells ? planner.decoded_cells() : planner.peak_cells());
  }
};

}  // namespace

std::unique_ptr<ForkStrategy> make_shared_fork() {
  return std::make_unique<SharedFork>();
}

}  // namespace swarmkv::detail
