// Pipelines: one shared document, prefilled once, and N agents forked from it.
//
// A pipeline is a DAG of named nodes: the prefill node (named "document")
// and one branch node per agent. Branches depend on the document and,
// optionally, on other agents (`depends_on`: wait for them to finish).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/graph.h"

namespace swarmkv {

// How branches get the document's KV state.
enum class ForkMode {
  kShared,  // default: one unified-KV context; fork = seq_cp (no copy), branches decoded batched
  kHost,    // prefill once, export a host snapshot, copy + restore it per branch
  kNone,    // baseline: every agent prefills the whole document in its own context
};
std::string_view to_string(ForkMode mode) noexcept;
// Parses "shared", "host" or "none"; throws Error(kInvalidArgument) naming them.
ForkMode parse_fork_mode(std::string_view name);

// One agent: its own prompt and generation settings.
struct AgentSpec {
  std::string name;
  std::string prompt;                   // the agent's question or instruction
  int32_t max_tokens = 128;             // generated tokens at most
  SamplingOptions sampling;             // temperature 0 = greedy
  std::vector<std::string> stop;        // stop strings
  std::vector<std::string> depends_on;  // other agents that must finish first
};

// Everything a run needs. Defaults match the CLI's.
struct PipelineSpec {
  std::string name = "pipeline";
  std::string document;         // the shared document's text
  std::string document_source;  // where it came from ("file:<path>" or "text"), for messages
  std::string system_prompt =
      "You are a careful analyst. Answer from the document only, concisely.";
  std::vector<AgentSpec> agents;
  std::string model;  // GGUF path; empty = the default model
  // KV cells per context; 0 = the smallest multiple of 256 that fits the
  // budget. kShared has one context for the prefix and every branch;
  // kHost/kNone one per concurrently running agent (see PipelineBudget).
  uint32_t n_ctx = 0;
  uint32_t n_batch = 512;  // prefill chunk size (kShared: at least n_seq_max)
  int32_t n_threads = 0;   // 0 = all cores
  ForkMode fork = ForkMode::kShared;
};

// Loads a pipeline file (YAML, or JSON, which YAML reads too). Relative
// `document.file` paths are resolved against the file's directory. Throws
// Error(kNotFound) for a missing file, Error(kInvalidArgument) naming the
// key for malformed content.
PipelineSpec load_pipeline_file(const std::string& path);

}  // namespace swarmkv

namespace swarmkv {

// The seed's LlamaGuard, kept as a policy: with kSerialized every branch's
// engine work (restore, prompt, generation) runs under one process-wide
// mutex, as the seed did because concurrent decode was unsafe in its GPU
// build. kConcurrent lets branches use their own contexts at the same time
// (llama.cpp allows different contexts on different threads). Waiting time is
// reported per agent as `wait` so the policy's cost is measured, not guessed.
// ForkMode::kShared has no guard: one decoder thread owns its context.
enum class GuardPolicy { kSerialized, kConcurrent };
std::string_view to_string(GuardPolicy policy) noexcept;
GuardPolicy parse_guard_policy(std::string_view name);

struct RunOptions {
  GuardPolicy guard = GuardPolicy::kSerialized;
  // Called from the prefill thread after each chunk: (tokens done, total).
  std::function<void(size_t, size_t)> on_prefill_progress;
  // Testing hook: the first position of every branch prompt. -1 (default)
  // means prefix_len, the only correct value; anything else reproduces the
  // classic RoPE bug so tests can prove they catch it.
  Pos branch_pos0_override = -1;
};

// Per-agent timings in milliseconds. Parts that a fork mode does not have
// are 0 (e.g. `prefill` under kHost, `fork` and `restore` under kNone).
struct AgentTimings {
  double wait = 0;     // kHost/kNone: waiting for the engine guard; kShared: for a free sequence id
  double context = 0;  // getting a context (0 when a warm one was reused)
  double prefill = 0;  // kNone only: this agent's own re-prefill of the document
  double fork = 0;  // kHost: copying the snapshot into the branch buffer; kShared: sampler + seq_cp
  double restore = 0;  // kHost: llama_state_set_data into the context
  // Decoding the agent's prompt at positions prefix_len + i; under kShared
  // the step(s) that carried it, shared with the other branches' tokens.
  double prompt = 0;
  double first_token = 0;  // from the start of the agent's own work to its first generated token
  double generate = 0;     // generating the answer
  double total = 0;        // the agent's own work, start to end (excludes waiting on dependencies)
  double done_at = 0;      // when the agent finished, from the start of the run
};

struct AgentResult {
  std::string name;
  NodeStatus status = NodeStatus::kOk;
  std::optional<ErrorValue> error;  // set unless ok (see NodeOutcome::error)
  std::string answer;
  std::vector<Token> tokens;  // the generated tokens
  StopReason stop_reason = StopReason::kMaxTokens;
  int32_t prompt_tokens = 0;  // the agent's prompt, template wrapping included
  AgentTimings timings_ms;
};

// One batched llama_decode of the shared fork (ForkMode::kShared).
struct DecodeStep {
  int32_t branches = 0;         // branches with tokens in this step
  int32_t prompt_tokens = 0;    // agent-prompt tokens in the batch
  int32_t generate_tokens = 0;  // one per generating branch
  double ms = 0;
};

struct PipelineResult {
  ForkMode fork = ForkMode::kShared;
  GuardPolicy guard = GuardPolicy::kSerialized;
  int32_t prefix_tokens = 0;  // the document with its template wrapping
  size_t snapshot_bytes = 0;  // kHost: size of the exported prefill context's state
  uint32_t n_ctx = 0;         // per context, as llama.cpp really uses it
  uint32_t n_seq_max = 1;     // sequence ids per context (kShared: agents + 1, capped)
  double prepare_ms = 0;      // tokenisation and validation
  double prefill_ms = 0;  // kHost: the one shared prefill; kNone: sum of the agents' re-prefills
  double export_ms = 0;   // kHost: llama_state_get_data into the snapshot arena
  double arena_ms = 0;    // kHost: allocating and pre-faulting the branch buffer once
  double total_ms = 0;    // the whole run, model load excluded

  // Memory. KV bytes per cell are measured on the live engine (the state
  // bytes of a context holding only the prefix / its cells), not taken from a
  // formula.
  int32_t contexts = 0;                  // llama.cpp contexts created
  int64_t kv_cells_peak = 0;             // KV cells holding data at the peak, all contexts
                                         // (kHost/kNone: contexts x the largest agent's cells)
  double kv_bytes_per_cell = 0;          // K and V of one token, all layers
  size_t host_buffer_bytes = 0;          // kHost: snapshot + branch buffers in host RAM
  std::vector<DecodeStep> decode_steps;  // kShared: every batched decode step, in order

  // kv_cells_peak and contexts x n_ctx, in bytes.
  double kv_bytes_peak() const noexcept {
    return static_cast<double>(kv_cells_peak) * kv_bytes_per_cell;
  }
  double kv_bytes_allocated() const noexcept {
    return static_cast<double>(contexts) * n_ctx * kv_bytes_per_cell;
  }
  NodeStatus document_status = NodeStatus::kOk;
  std::optional<ErrorValue> document_error;  // set unless ok
  std::vector<AgentResult> agents;           // in the order of PipelineSpec::agents

  bool ok() const noexcept;
};

// The token budget of a pipeline, computed before anything is allocated.
// kHost/kNone: every context holds the prefix and one agent:
//   required = prefix_tokens + max_branch_tokens + headroom.
// kShared: one context holds the prefix once and every branch:
//   required = prefix_tokens + sum_branch_tokens.
struct PipelineBudget {
  ForkMode fork = ForkMode::kShared;
  int32_t prefix_tokens = 0;
  int32_t max_branch_tokens = 0;  // longest agent prompt (with template wrapping)
  int32_t headroom = 0;           // generation budget: the largest max_tokens
  int64_t sum_branch_tokens = 0;  // sum over agents of prompt tokens + max_tokens
  int64_t required = 0;
  uint32_t n_ctx = 0;      // the spec's, or the automatic size when it was 0
  uint32_t n_seq_max = 1;  // kShared: agents + 1, at most max_parallel_sequences()
};

// The document and agent prompts as tokens, with the chat template applied:
// the prefix is everything up to the end of the document, each branch the
// rest (agent prompt, end of turn, assistant opening).
struct PreparedPipeline {
  std::vector<Token> prefix;
  std::vector<std::vector<Token>> branches;  // one per agent, same order
  PipelineBudget budget;
};

// Validates `spec` and tokenises it; allocates no context or buffer. Throws
// Error: kInvalidArgument ("the document is empty", no agents, bad agent
// settings), kGraph (duplicate name, unknown dependency, cycle), kBudget:
// "context budget exceeded: prefix_tokens P + max_branch_tokens B + headroom H
// = required R > n_ctx N" (kHost/kNone) or "context budget exceeded (fork
// shared, one context for all): prefix_tokens P + branch_tokens S (prompt +
// max_tokens of A agents) = required R > n_ctx N" (kShared).
PreparedPipeline prepare_pipeline(const PipelineSpec& spec, const Model& model);

// Runs the pipeline: prepare, then the prefill node and one branch node per
// agent on the graph executor. Throws only what prepare_pipeline throws;
// failures while running are reported per node in the result.
PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options = {});

}  // namespace swarmkv
