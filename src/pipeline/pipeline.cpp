#include "swarmkv/pipeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include <fmt/format.h>

#include "kv/host_buffer_pool.h"
#include "pipeline/shared_decoder.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"

namespace swarmkv {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

constexpr std::string_view kDocumentNode = "document";
// Splits the rendered chat template at the agent's prompt. Chosen so that no
// real document or prompt contains it.
constexpr std::string_view kPromptMarker = "\x1f<swarmkv-agent-prompt>\x1f";

// Warm contexts, handed out again instead of being created per branch
// (creating one costs far more than clearing and restoring it). Thread-safe.
class ContextPool {
 public:
  ContextPool(std::shared_ptr<const Model> model, ContextOptions options)
      : model_(std::move(model)), options_(options) {}

  // Returns a context with empty memory: a warm one when available.
  std::unique_ptr<Context> acquire() {
    {
      std::lock_guard lock(mutex_);
      if (!free_.empty()) {
        auto ctx = std::move(free_.back());
        free_.pop_back();
        ctx->memory_clear();
        return ctx;
      }
    }
    auto ctx = std::make_unique<Context>(model_, options_);
    std::lock_guard lock(mutex_);
    ++created_;
    return ctx;
  }

  int32_t created() const {
    std::lock_guard lock(mutex_);
    return created_;
  }

  void release(std::unique_ptr<Context> ctx) {
    std::lock_guard lock(mutex_);
    free_.push_back(std::move(ctx));
  }

 private:
  std::shared_ptr<const Model> model_;
  ContextOptions options_;
  mutable std::mutex mutex_;
  std::vector<std::unique_ptr<Context>> free_;
  int32_t created_ = 0;
};

// Everything the nodes of one run share.
struct PipelineState : RunState {
  const PipelineSpec* spec = nullptr;
  const PreparedPipeline* prepared = nullptr;
  const RunOptions* options = nullptr;
  std::shared_ptr<const Model> model;
  ContextOptions context_options;
  std::unique_ptr<ContextPool> contexts;
  detail::HostBufferPool buffers;
  detail::HostBuffer snapshot;  // written by the prefill node before any branch reads it
  // kShared: the one context and its decoder (destroyed first), both created
  // by the prefill node before any branch runs.
  std::unique_ptr<Context> shared_context;
  std::unique_ptr<detail::SharedDecoder> decoder;
  std::mutex engine_mutex;  // the seed's LlamaGuard (GuardPolicy::kSerialized)
  std::mutex result_mutex;  // guards `result`
  PipelineResult result;
  Clock::time_point started;    // the run's start, for AgentTimings::done_at
  int64_t max_agent_cells = 0;  // kHost/kNone: the fullest context, guarded by result_mutex

  std::unique_lock<std::mutex> engine_guard() {
    return options->guard == GuardPolicy::kSerialized ? std::unique_lock(engine_mutex)
                                                      : std::unique_lock<std::mutex>();
  }
};

// The root: prefills the document once and exports its KV state (kHost).
class PrefillNode final : public Node {
 public:
  PrefillNode() : Node(std::string(kDocumentNode), {}) {}

  void execute(RunState& run) override {
    auto& state = static_cast<PipelineState&>(run);
    if (state.spec->fork == ForkMode::kNone) return;  // every agent prefills for itself
    if (state.spec->fork == ForkMode::kShared) return execute_shared(state);
    const std::vector<Token>& prefix = state.prepared->prefix;
    auto guard = state.engine_guard();
    auto ctx = state.contexts->acquire();
    const auto t0 = Clock::now();
    ctx->decode_prompt(prefix, 0, 0, /*logits_last=*/false, state.options->on_prefill_progress);
    const auto t1 = Clock::now();
    // The size comes from the live engine, never from a formula. The whole
    // context (it holds only the prefix): its restore puts every cell back at
    // its index, which keeps sliding-window models bit-exact (NOTES.md).
    detail::HostBuffer snapshot = state.buffers.acquire(ctx->state_size());
    const size_t written = ctx->state_get(snapshot.bytes());
    snapshot.truncate(written);
    const auto t2 = Clock::now();
    // Pre-fault one branch buffer now, so that the first fork costs a memcpy
    // like every later one (a fresh 80 MB buffer costs ~230 ms of page faults).
    state.buffers.acquire(written);
    const auto t3 = Clock::now();
    // Keep the prefill context warm: the first branch restores into it.
    state.contexts->release(std::move(ctx));
    std::lock_guard lock(state.result_mutex);
    state.snapshot = std::move(snapshot);
    state.result.prefill_ms = ms_between(t0, t1);
    state.result.export_ms = ms_between(t1, t2);
    state.result.arena_ms = ms_between(t2, t3);
    state.result.snapshot_bytes = written;
    state.result.kv_bytes_per_cell =
        static_cast<double>(written) / static_cast<double>(prefix.size());
    state.result.host_buffer_bytes = 2 * written;  // the snapshot + one pooled branch buffer
    log_info("prefill: {} tokens in {:.1f} ms, snapshot {} bytes exported in {:.1f} ms",
             prefix.size(), state.result.prefill_ms, written, state.result.export_ms);
  }

 private:
  // One unified-KV context: the prefix on sequence 0, then a decoder thread
  // that forks branches with seq_cp and decodes them batched.
  static void execute_shared(PipelineState& state) {
    const std::vector<Token>& prefix = state.prepared->prefix;
    ContextOptions options = state.context_options;
    options.kv_unified = true;
    options.n_seq_max = state.prepared->budget.n_seq_max;
    options.n_batch = std::max(options.n_batch, options.n_seq_max);  // room for every live branch
    options.n_ubatch = options.n_batch;
    auto ctx = std::make_unique<Context>(state.model, options);
    const auto t0 = Clock::now();
    ctx->decode_prompt(prefix, 0, 0, /*logits_last=*/false, state.options->on_prefill_progress);
    const auto t1 = Clock::now();
    const size_t prefix_bytes = ctx->state_size();  // the context holds only the prefix
    std::lock_guard lock(state.result_mutex);
    state.result.prefill_ms = ms_between(t0, t1);
    state.result.n_ctx = ctx->options().n_ctx;
    state.result.n_seq_max = ctx->options().n_seq_max;
    state.result.contexts = 1;
    state.result.kv_bytes_per_cell =
        static_cast<double>(prefix_bytes) / static_cast<double>(prefix.size());
    state.shared_context = std::move(ctx);
    std::vector<std::vector<size_t>> agent_deps(state.spec->agents.size());
    for (size_t i = 0; i < agent_deps.size(); ++i) {
      for (const std::string& dep : state.spec->agents[i].depends_on) {
        for (size_t j = 0; j < agent_deps.size(); ++j) {
          if (state.spec->agents[j].name == dep) agent_deps[i].push_back(j);
        }
      }
    }
    state.decoder = std::make_unique<detail::SharedDecoder>(
        *state.shared_context, static_cast<Pos>(prefix.size()), std::move(agent_deps));
    log_info("prefill: {} tokens in {:.1f} ms into a shared context (n_ctx {}, n_seq_max {})",
             prefix.size(), state.result.prefill_ms, state.result.n_ctx, state.result.n_seq_max);
  }
};

// One agent: fork from the snapshot (or re-prefill), decode its prompt, answer.
class BranchNode final : public Node {
 public:
  BranchNode(size_t index, const AgentSpec& agent)
      : Node(agent.name, dependencies_of(agent)), index_(index) {}

  void execute(RunState& run) override {
    auto& state = static_cast<PipelineState&>(run);
    const AgentSpec& agent = state.spec->agents[index_];
    const std::vector<Token>& prompt = state.prepared->branches[index_];
    const auto prefix_len = static_cast<Pos>(state.prepared->prefix.size());
    AgentResult& out = state.result.agents[index_];  // this node's own slot
    AgentTimings& t = out.timings_ms;
    const Pos pos0 =
        state.options->branch_pos0_override >= 0 ? state.options->branch_pos0_override : prefix_len;
    if (state.spec->fork == ForkMode::kShared)
      return execute_shared(state, agent, prompt, pos0, out);
    const auto start = Clock::now();

    const auto w0 = Clock::now();
    auto guard = state.engine_guard();
    t.wait = ms_between(w0, Clock::now());
    const auto work_start = Clock::now();

    size_t ctx_state_bytes = 0;
    const auto c0 = Clock::now();
    auto ctx = state.contexts->acquire();
    t.context = ms_between(c0, Clock::now());
    {
      std::lock_guard lock(state.result_mutex);
      state.result.n_ctx = ctx->options().n_ctx;  // what llama.cpp really uses (it pads)
    }

    if (state.spec->fork == ForkMode::kHost) {
      // Copy-on-fork into a warm pooled buffer: under the serialized guard one
      // buffer serves every branch in turn, so a fork costs memcpy bandwidth,
      // not page faults.
      const auto f0 = Clock::now();
      detail::HostBuffer branch_buffer = state.buffers.acquire(state.snapshot.size());
      std::memcpy(branch_buffer.bytes().data(), state.snapshot.bytes().data(),
                  state.snapshot.size());
      const auto r0 = Clock::now();
      t.fork = ms_between(f0, r0);
      // Throws unless llama.cpp consumed exactly the copied bytes.
      ctx->state_set(branch_buffer.bytes());
      t.restore = ms_between(r0, Clock::now());
    } else {
      const auto p0 = Clock::now();
      ctx->decode_prompt(state.prepared->prefix, 0, 0, /*logits_last=*/false);
      t.prefill = ms_between(p0, Clock::now());
      // For the memory report (outside the timings); one agent's measure suffices.
      if (index_ == 0) ctx_state_bytes = ctx->state_size();
    }

    const auto q0 = Clock::now();
    ctx->decode_prompt(prompt, pos0, 0, /*logits_last=*/true);
    t.prompt = ms_between(q0, Clock::now());

    Sampler sampler(agent.sampling);
    GenerateOptions gen;
    gen.max_tokens = agent.max_tokens;
    gen.stop = agent.stop;
    const auto g0 = Clock::now();
    Generation answer = generate(*ctx, sampler, 0, pos0 + static_cast<Pos>(prompt.size()), gen);
    const auto g1 = Clock::now();
    t.generate = ms_between(g0, g1);
    // The first token is sampled from the prompt's logits before any
    // generation decode; its cost is the work up to generation.
    t.first_token = ms_between(work_start, g0);
    state.contexts->release(std::move(ctx));
    t.total = ms_between(start, g1) - t.wait;
    t.done_at = ms_between(state.started, g1);
    {
      const int64_t cells = prefix_len + static_cast<int64_t>(prompt.size()) +
                            static_cast<int64_t>(answer.tokens.size());
      std::lock_guard lock(state.result_mutex);
      state.max_agent_cells = std::max(state.max_agent_cells, cells);
      if (ctx_state_bytes > 0) {
        state.result.kv_bytes_per_cell = static_cast<double>(ctx_state_bytes) / prefix_len;
      }
    }

    out.answer = std::move(answer.text);
    out.tokens = std::move(answer.tokens);
    out.stop_reason = answer.stop_reason;
  }

 private:
  static std::vector<std::string> dependencies_of(const AgentSpec& agent) {
    std::vector<std::string> deps{std::string(kDocumentNode)};
    deps.insert(deps.end(), agent.depends_on.begin(), agent.depends_on.end());
    return deps;
  }

  // Hands the branch to the shared decoder and waits for its answer.
  void execute_shared(PipelineState& state, const AgentSpec& agent,
                      const std::vector<Token>& prompt, Pos pos0, AgentResult& out) const {
    GenerateOptions gen;
    gen.max_tokens = agent.max_tokens;
    gen.stop = agent.stop;
    detail::SharedBranchOutcome r =
        state.decoder->submit(index_, prompt, pos0, agent.sampling, gen).get();
    if (r.error) throw Error(*r.error);  // a new exception, owned by this thread
    AgentTimings& t = out.timings_ms;
    t.wait = r.queued;
    t.fork = r.fork;
    t.prompt = r.prompt;
    t.first_token = r.first_token;
    t.generate = r.generate;
    t.total = r.total;
    t.done_at = ms_between(state.started, Clock::now());
    out.answer = std::move(r.generation.text);
    out.tokens = std::move(r.generation.tokens);
    out.stop_reason = r.generation.stop_reason;
  }

  size_t index_;
};

std::vector<std::unique_ptr<Node>> build_graph(const PipelineSpec& spec) {
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.push_back(std::make_unique<PrefillNode>());
  for (size_t i = 0; i < spec.agents.size(); ++i)
    nodes.push_back(std::make_unique<BranchNode>(i, spec.agents[i]));
  return nodes;
}

void validate_agents(const PipelineSpec& spec) {
  if (spec.agents.empty()) throw Error(ErrorCode::kInvalidArgument, "the pipeline has no agents");
  for (const AgentSpec& a : spec.agents) {
    if (a.name.empty()) throw Error(ErrorCode::kInvalidArgument, "an agent has an empty name");
    if (a.name == kDocumentNode) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent name '{}' is reserved for the prefill node", a.name));
    }
    if (a.prompt.empty())
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("agent '{}' has an empty prompt", a.name));
    if (a.max_tokens < 1) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("agent '{}': max_tokens must be >= 1 (got {})", a.name, a.max_tokens));
    }
    if (!(a.sampling.top_p > 0.0f && a.sampling.top_p <= 1.0f) || a.sampling.top_k < 0 ||
        a.sampling.temperature < 0.0f) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format(
              "agent '{}': need temperature >= 0, top_p in (0, 1], top_k >= 0 (got {}, {}, {})",
              a.name, a.sampling.temperature, a.sampling.top_p, a.sampling.top_k));
    }
  }
}

}  // namespace

std::string_view to_string(ForkMode mode) noexcept {
  switch (mode) {
    case ForkMode::kShared:
      return "shared";
    case ForkMode::kHost:
      return "host";
    case ForkMode::kNone:
      return "none";
  }
  return "unknown";
}

ForkMode parse_fork_mode(std::string_view name) {
  if (name == "shared") return ForkMode::kShared;
  if (name == "host") return ForkMode::kHost;
  if (name == "none") return ForkMode::kNone;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown fork mode '{}' (expected shared, host or none)", name));
}

std::string_view to_string(GuardPolicy policy) noexcept {
  return policy == GuardPolicy::kSerialized ? "serialized" : "concurrent";
}

GuardPolicy parse_guard_policy(std::string_view name) {
  if (name == "serialized") return GuardPolicy::kSerialized;
  if (name == "concurrent") return GuardPolicy::kConcurrent;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown guard policy '{}' (expected serialized or concurrent)", name));
}

bool PipelineResult::ok() const noexcept {
  return document_status == NodeStatus::kOk &&
         std::all_of(agents.begin(), agents.end(),
                     [](const AgentResult& a) { return a.status == NodeStatus::kOk; });
}

PreparedPipeline prepare_pipeline(const PipelineSpec& spec, const Model& model) {
  if (spec.document.find_first_not_of(" \t\r\n") == std::string::npos) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("the document is empty{}", spec.document_source.empty()
                                                   ? std::string()
                                                   : fmt::format(" ({})", spec.document_source)));
  }
  validate_agents(spec);
  validate_graph(build_graph(spec));

  // Render the chat once with a marker where the agent's prompt goes: what
  // comes before it is the shared prefix, what follows closes every branch.
  std::string head;
  std::string tail;
  if (model.has_chat_template()) {
    std::vector<ChatMessage> chat;
    if (!spec.system_prompt.empty()) chat.push_back({"system", spec.system_prompt});
    chat.push_back({"user", spec.document + "\n\n" + std::string(kPromptMarker)});
    const std::string rendered = model.apply_chat_template(chat, /*add_assistant=*/true);
    const size_t at = rendered.find(kPromptMarker);
    if (at == std::string::npos) {
      throw Error(ErrorCode::kChatTemplate,
                  "the chat template dropped the agent prompt; cannot split the prefix");
    }
    head = rendered.substr(0, at);
    tail = rendered.substr(at + kPromptMarker.size());
  } else {
    head = (spec.system_prompt.empty() ? std::string() : spec.system_prompt + "\n\n") +
           spec.document + "\n\n";
    tail = "\nAnswer:";
  }

  PreparedPipeline out;
  out.prefix = model.tokenize(head, /*add_special=*/true);
  for (const AgentSpec& a : spec.agents) {
    out.branches.push_back(model.tokenize(a.prompt + tail, /*add_special=*/false));
  }
  PipelineBudget& b = out.budget;
  b.fork = spec.fork;
  b.prefix_tokens = static_cast<int32_t>(out.prefix.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    const auto prompt_tokens = static_cast<int32_t>(out.branches[i].size());
    b.max_branch_tokens = std::max(b.max_branch_tokens, prompt_tokens);
    b.headroom = std::max(b.headroom, spec.agents[i].max_tokens);
    b.sum_branch_tokens += static_cast<int64_t>(prompt_tokens) + spec.agents[i].max_tokens;
  }
  const bool shared = spec.fork == ForkMode::kShared;
  b.required = shared ? b.prefix_tokens + b.sum_branch_tokens
                      : static_cast<int64_t>(b.prefix_tokens) + b.max_branch_tokens + b.headroom;
  b.n_seq_max = shared ? static_cast<uint32_t>(
                             std::min<size_t>(spec.agents.size() + 1, max_parallel_sequences()))
                       : 1;
  // 0 = automatic: the smallest multiple of 256 that holds the budget.
  b.n_ctx = spec.n_ctx > 0 ? spec.n_ctx : static_cast<uint32_t>((b.required + 255) / 256 * 256);
  if (b.required > static_cast<int64_t>(b.n_ctx)) {
    if (shared) {
      throw Error(ErrorCode::kBudget,
                  fmt::format("context budget exceeded (fork shared, one context for all): "
                              "prefix_tokens {} + branch_tokens {} (prompt + max_tokens of {} "
                              "agents) = required {} > n_ctx {}",
                              b.prefix_tokens, b.sum_branch_tokens, spec.agents.size(), b.required,
                              b.n_ctx));
    }
    throw Error(
        ErrorCode::kBudget,
        fmt::format(
            "context budget exceeded: prefix_tokens {} + max_branch_tokens {} + headroom {} = "
            "required {} > n_ctx {}",
            b.prefix_tokens, b.max_branch_tokens, b.headroom, b.required, b.n_ctx));
  }
  if (b.n_ctx > static_cast<uint32_t>(model.n_ctx_train()) && model.n_ctx_train() > 0) {
    log_warn("n_ctx {} is larger than the model was trained for ({}); answers may degrade", b.n_ctx,
             model.n_ctx_train());
  }
  return out;
}

PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options) {
  if (!model) throw Error(ErrorCode::kInvalidArgument, "run_pipeline needs a model");
  const auto start = Clock::now();
  const PreparedPipeline prepared = prepare_pipeline(spec, *model);
  const auto prepared_at = Clock::now();

  PipelineState state;
  state.started = start;
  state.spec = &spec;
  state.prepared = &prepared;
  state.options = &options;
  state.model = model;
  state.context_options.n_ctx = prepared.budget.n_ctx;
  state.context_options.n_batch = spec.n_batch;
  state.context_options.n_ubatch = spec.n_batch;
  state.context_options.n_threads = spec.n_threads;
  state.contexts = std::make_unique<ContextPool>(model, state.context_options);
  state.result.fork = spec.fork;
  state.result.guard = options.guard;
  state.result.prefix_tokens = prepared.budget.prefix_tokens;
  state.result.n_ctx = prepared.budget.n_ctx;  // replaced by the padded value once a context exists
  state.result.prepare_ms = ms_between(start, prepared_at);
  state.result.agents.resize(spec.agents.size());
  for (size_t i = 0; i < spec.agents.size(); ++i) {
    state.result.agents[i].name = spec.agents[i].name;
    state.result.agents[i].prompt_tokens = static_cast<int32_t>(prepared.branches[i].size());
  }

  const std::vector<NodeOutcome> outcomes = execute_graph(build_graph(spec), state);
  if (state.decoder) {
    state.decoder->close();  // every branch is done; joins the decoder thread
    state.result.decode_steps = state.decoder->steps();
    state.result.kv_cells_peak = state.decoder->peak_cells();
  } else {
    state.result.contexts = state.contexts->created();
    state.result.kv_cells_peak = state.result.contexts * state.max_agent_cells;
  }

  PipelineResult result = std::move(state.result);
  for (const NodeOutcome& o : outcomes) {
    if (o.name == kDocumentNode) {
      result.document_status = o.status;
      result.document_error = o.error;
      continue;
    }
    for (AgentResult& a : result.agents) {
      if (a.name == o.name) {
        a.status = o.status;
        a.error = o.error;
      }
    }
  }
  if (spec.fork == ForkMode::kNone) {
    result.prefill_ms = 0;
    for (const AgentResult& a : result.agents) result.prefill_ms += a.timings_ms.prefill;
  }
  result.total_ms = ms_between(start, Clock::now());
  return result;
}

}  // namespace swarmkv
