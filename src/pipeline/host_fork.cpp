// ForkMode::kHost: the document's whole-context KV state (restored from a
// snapshot, or prefilled once and exported; prefix_source.h) is kept in host
// RAM; each branch copies it into a warm pooled buffer and restores it into
// its own context. A
// whole-context restore puts every cell back at its index, which keeps
// answers bit-identical to a re-prefill, sliding-window models included
// (NOTES.md, "Exact host fork on sliding-window models").
#include <cstring>

#include "pipeline/context_per_branch.h"
#include "pipeline/host_buffer_pool.h"
#include "prefix/prefix_source.h"
#include "swarmkv/log.h"

namespace swarmkv::detail {
namespace {

class HostFork final : public ContextPerBranchFork {
 public:
  explicit HostFork(GuardPolicy guard) : ContextPerBranchFork(ForkMode::kHost, guard) {}

 private:
  void obtain_prefix(const RunInputs& in, PipelineResult& result) override {
    const std::vector<Token>& prefix = in.prepared.prefix;
    PrefixState state = obtain_prefix_state(in.spec, prefix, in.options.snapshot,
                                            in.options.on_prefill_progress, in.model);
    const Stopwatch b;
    // Pre-fault one branch buffer now, so that the first fork costs a memcpy
    // like every later one (a fresh 80 MB buffer costs ~230 ms of page faults).
    buffers_.acquire(state.bytes.size());
    result.branch_buffer_ms = b.ms();
    snapshot_ = std::move(state.bytes);
    prefix_tokens_ = prefix.size();
    snapshot_path_ = state.use.path;
    result.document_prefills = state.use.prefilled_tokens > 0 ? 1 : 0;
    result.prefill_ms = state.prefill_ms;
    result.export_ms = state.export_ms;
    result.snapshot_bytes = snapshot_.size();
    result.kv_bytes_per_cell =
        static_cast<double>(snapshot_.size()) / static_cast<double>(prefix.size());
    result.host_buffer_bytes = 2 * snapshot_.size();  // the snapshot + one pooled branch buffer
    result.snapshot = std::move(state.use);
  }

  double open_branch(const RunInputs&, size_t, Context& ctx, AgentTimings& t) override {
    // Copy-on-fork into a warm pooled buffer: with one worker, one buffer
    // serves every branch in turn, so a fork costs memcpy bandwidth, not
    // page faults.
    const auto f0 = Clock::now();
    HostBuffer branch = buffers_.acquire(snapshot_.size());
    std::memcpy(branch.bytes().data(), snapshot_.data(), snapshot_.size());
    const auto r0 = Clock::now();
    t.fork = ms_between(f0, r0);
    restore_prefix(ctx, branch.bytes(), prefix_tokens_, snapshot_path_);
    t.restore = ms_between(r0, Clock::now());
    return 0;
  }

  void finish(const RunInputs&, PipelineResult&) override {}

  HostBufferPool buffers_;         // thread-safe
  std::vector<uint8_t> snapshot_;  // written by the document node before any branch reads it
  size_t prefix_tokens_ = 0;       // likewise
  std::string snapshot_path_;      // likewise: where snapshot_ came from ("" prefilled)
};

}  // namespace

std::unique_ptr<ForkStrategy> make_host_fork(GuardPolicy guard) {
  return std::make_unique<HostFork>(guard);
}

}  // namespace swarmkv::detail
