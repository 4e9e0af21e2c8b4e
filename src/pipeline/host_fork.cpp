// ForkMode::kHost: the document is prefilled once into a pool context whose
// whole KV state is exported to host RAM; each branch copies that snapshot
// into a warm pooled buffer and restores it into its own context. A
// whole-context restore puts every cell back at its index, which keeps
// answers bit-identical to a re-prefill, sliding-window models included
// (NOTES.md, "Exact host fork on sliding-window models").
#include <cstring>

#include "pipeline/context_per_branch.h"
#include "pipeline/host_buffer_pool.h"
#include "swarmkv/log.h"

namespace swarmkv::detail {
namespace {

class HostFork final : public ContextPerBranchFork {
 public:
  explicit HostFork(GuardPolicy guard) : ContextPerBranchFork(ForkMode::kHost, guard) {}

 private:
  void obtain_prefix(const RunInputs& in, PipelineResult& result) override {
    const std::vector<Token>& prefix = in.prepared.prefix;
    auto ctx = pool().acquire();
    const auto t0 = Clock::now();
    ctx->decode_prompt(prefix, 0, 0, /*logits_last=*/false, in.options.on_prefill_progress);
    const auto t1 = Clock::now();
    // The size comes from the live engine, never from a formula.
    HostBuffer snapshot = buffers_.acquire(ctx->state_size());
    const size_t written = ctx->state_get(snapshot.bytes());
    snapshot.truncate(written);
    const auto t2 = Clock::now();
    // Pre-fault one branch buffer now, so that the first fork costs a memcpy
    // like every later one (a fresh 80 MB buffer costs ~230 ms of page faults).
    buffers_.acquire(written);
    const auto t3 = Clock::now();
    pool().release(std::move(ctx));  // warm: the first branch restores into it
    snapshot_ = std::move(snapshot);
    result.document_prefills = 1;
    result.prefill_ms = ms_between(t0, t1);
    result.export_ms = ms_between(t1, t2);
    result.branch_buffer_ms = ms_between(t2, t3);
    result.snapshot_bytes = written;
    result.kv_bytes_per_cell = static_cast<double>(written) / static_cast<double>(prefix.size());
    result.host_buffer_bytes = 2 * written;  // the snapshot + one pooled branch buffer
    log_info("prefill: {} tokens in {:.1f} ms, snapshot {} bytes exported in {:.1f} ms",
             prefix.size(), result.prefill_ms, written, result.export_ms);
  }

  double open_branch(const RunInputs&, size_t, Context& ctx, AgentTimings& t) override {
    // Copy-on-fork into a warm pooled buffer: with one worker, one buffer
    // serves every branch in turn, so a fork costs memcpy bandwidth, not
    // page faults.
    const auto f0 = Clock::now();
    HostBuffer branch = buffers_.acquire(snapshot_.size());
    std::memcpy(branch.bytes().data(), snapshot_.bytes().data(), snapshot_.size());
    const auto r0 = Clock::now();
    t.fork = ms_between(f0, r0);
    ctx.state_set(branch.bytes());  // exact bytes or Error(kState), memory left empty
    t.restore = ms_between(r0, Clock::now());
    return 0;
  }

  void finish(const RunInputs&, PipelineResult&) override {}

  HostBufferPool buffers_;  // thread-safe
  HostBuffer snapshot_;     // written by the document node before any branch reads it
};

}  // namespace

std::unique_ptr<ForkStrategy> make_host_fork(GuardPolicy guard) {
  return std::make_unique<HostFork>(guard);
}

}  // namespace swarmkv::detail
