// Pipelines: one shared document, prefilled once, and N agents forked from it.
//
// A pipeline is a DAG of named nodes: the document (named "document") and
// one node per agent. Every agent depends on the document and, optionally,
// on other agents (`depends_on`: wait for them to finish). An agent's branch
// is its fork of the document's KV state: a sequence of a shared context, or
// a context of its own.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/snapshot.h"
#include "swarmkv/tools.h"

namespace swarmkv {

// How branches get the document's KV state; each mode is one fork strategy
// (src/pipeline/*_fork.cpp).
enum class ForkMode {
  kShared,  // default: one unified-KV context; fork = seq_cp (no copy), branches decoded batched
  kHost,    // prefill once, export a host snapshot, copy + restore it per branch
  kNone,    // the reference: every agent re-prefills the whole document in its own context
};
std::string_view to_string(ForkMode mode) noexcept;
// Parses "shared", "host" or "none"; throws Error(kInvalidArgument) naming them.
ForkMode parse_fork_mode(std::string_view name);

// What a fork mode means to the code around its strategy (budget, memory,
// snapshots, the cluster). Defined beside the strategy factory, the one
// other place that tells the modes apart.
struct ForkTraits {
  bool one_context = false;     // the prefix and every branch in one unified-KV context (shared)
  bool prefix_state = false;    // the document's KV state is made once and reused (shared, host)
  bool host_buffers = false;    // branches restore that state from host RAM buffers (host)
  bool branch_workers = false;  // a context per running branch; GuardPolicy applies (host, none)
};
ForkTraits fork_traits(ForkMode mode);

// The part of the document an agent needs (a watermark): it starts once
// the prefill has passed that point and sees the document cut there. At
// most one of the two; neither = the whole document.
struct DocumentNeeds {
  int32_t tokens = 0;  // the document's first N tokens (not counting system turn or template)
  std::string until;   // the document up to and including the first occurrence of this text
  bool any() const noexcept { return tokens > 0 || !until.empty(); }
  bool operator==(const DocumentNeeds&) const = default;
};

// One agent: its own prompt and generation settings.
struct AgentSpec {
  std::string name;
  // The agent's question or instruction. `{{name}}` (spaces inside the
  // braces allowed) is replaced by the answer of agent `name`, which must be
  // among its dependencies (depends_on, directly or not), when this agent
  // starts; the answer's text goes in as is, never expanded again.
  // `{{name.field}}`, `{{name.list[0]}}`: a field of the JSON answer of an
  // agent with a json_schema (resolve_placeholder, placeholder_value).
  std::string prompt;
  int32_t max_tokens = 128;  // generated tokens at most
  SamplingOptions sampling;  // temperature 0 = greedy (validate_sampling)
  // The JSON Schema the answer must satisfy, as compact JSON text; empty =
  // none. sampling.grammar holds the grammar made from it
  // (grammar_from_json_schema), and the answer, once complete, is JSON
  // (AgentResult::answer_is_json). An agent may have a grammar without a
  // schema (`grammar:` in a pipeline file): its answer is text that matches.
  std::string json_schema;
  // The functions the answer is a call of (a pipeline file's `tools:`,
  // narrowed by `tool_choice:`); empty = none. json_schema is then
  // tool_call_schema(tools) and the agent's turn ends with
  // tools_prompt(tools) (agent_turn): the answer is {"name", "arguments"},
  // for the caller or a downstream agent to execute.
  std::vector<ToolFunction> tools;
  // `tool_choice: auto`: the answer is a call of one of `tools` or text, as
  // {"response": ...} (tool_call_schema's `or_text`).
  bool tool_or_text = false;
  std::vector<std::string> stop;        // stop strings
  std::vector<std::string> depends_on;  // other agents that must finish first
  // Admission order among ready agents: higher first, then file order.
  int32_t priority = 0;
  // Continue agent `fork_from`'s conversation (a dependency, implied): this
  // agent's context is the document, the parent's prompt and answer, then
  // its own prompt as the next user turn. Empty: fork from the document.
  std::string fork_from;
  // A prefix of the document is enough (not with fork_from). Under kShared
  // a run that prefills the document starts the agent as soon as the
  // prefill passes it (streaming prefill: its tokens share the decode calls
  // of the remaining prefill chunks).
  DocumentNeeds needs;
  bool operator==(const AgentSpec&) const = default;
};

// A `{{name}}` in a prompt: the agent it names and where it stands.
struct PromptPlaceholder {
  std::string name;  // trimmed of spaces
  size_t begin = 0;  // of "{{"
  size_t end = 0;    // one past "}}"
};
// The placeholders of `prompt`, in order. A "{{" without a "}}" after it is
// text.
std::vector<PromptPlaceholder> prompt_placeholders(std::string_view prompt);
// `prompt` with each placeholder replaced by answers.at(name), in one pass.
std::string render_prompt(std::string_view prompt,
                          const std::map<std::string, std::string>& answers);
// Makes `agent`'s answer a call of one of `tools` (non-empty), or with
// `or_text` a call or text: sets tools, tool_or_text, json_schema
// (tool_call_schema) and sampling.grammar. Throws Error(kInvalidArgument)
// for a schema the converter cannot handle.
void call_tools(AgentSpec& agent, std::vector<ToolFunction> tools, bool or_text = false);
// The text of an agent's user turn: its prompt rendered with `answers`
// (render_prompt), then, with tools, tools_prompt(tools) after a blank line.
std::string agent_turn(const AgentSpec& agent, const std::map<std::string, std::string>& answers);
// Whether an agent's branch is known only when it starts: placeholders
// (other agents' answers) or fork_from (its parent's conversation).
bool renders_at_start(const AgentSpec& agent);

// Everything a run needs. Defaults match the CLI's. Its engine settings
// (n_batch, threads, flash attention, KV type, exact, GPU layers) are its
// EngineSettings base (swarmkv/engine.h).
struct PipelineSpec : EngineSettings {
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
  ForkMode fork = ForkMode::kShared;
  // kShared: the most branches decoded at once; 0 = as many as fit
  // (n_seq_max - 1). Fewer live branches make each step cheaper and the
  // first admitted agents finish sooner, at the cost of throughput.
  int32_t max_live = 0;
  // No document (a corpus's reduce stage): each agent's chat is the system
  // prompt and its own prompt; `document` stays empty and no agent has
  // `needs`. Not carried by pipeline_json.
  bool no_document = false;
  // Placeholders whose text (trimmed, e.g. "risks[*]") is a key here take
  // its value instead of an agent's answer, as is (a corpus's reduce stage
  // gets the documents' answers so). Not carried by pipeline_json.
  std::map<std::string, std::string> inputs;

  // The index in `agents` of the agent named `agent`, if there is one: a
  // scan of the agents (a loop over them all looks names up in a map).
  std::optional<size_t> agent_index(std::string_view agent) const;
  bool any_needs() const;      // an agent reads only part of the document
  bool any_fork_from() const;  // an agent continues another's conversation
  bool operator==(const PipelineSpec&) const = default;
};

// What a placeholder takes: agent `agent`'s whole answer (`field` empty),
// or a field of its JSON answer, as a path: ".level", "[0]",
// ".clauses[2].text".
struct PlaceholderRef {
  std::string agent;
  std::string field;
};
// `{{text}}` in `spec`: the whole answer when `text` names an agent, else
// the agent named before its first '.' or '[' and the path after it;
// nullopt when neither names an agent. A path that does not parse is
// Error(kInvalidArgument).
std::optional<PlaceholderRef> resolve_placeholder(const PipelineSpec& spec, std::string_view text);
// The same, with the agents' names looked up by `is_agent` (a map's, for
// pipelines of many agents: PipelineSpec::agent_index scans).
std::optional<PlaceholderRef> resolve_placeholder(
    std::string_view text, const std::function<bool(std::string_view)>& is_agent);
// What `ref` inserts, given its agent's answer: the answer itself, or the
// field (a JSON string as its text, any other value as JSON). Throws
// Error(kInvalidArgument) when the answer is not JSON or has no such field.
std::string placeholder_value(const PlaceholderRef& ref, const std::string& answer);
// The placeholders' values of `prompt`, keyed by their text, for
// render_prompt, from the answers of `spec`'s agents by name.
std::map<std::string, std::string> placeholder_values(
    const PipelineSpec& spec, std::string_view prompt,
    const std::function<const std::string&(size_t agent)>& answer_of);

// One document of a corpus (`documents:` in a pipeline file, `run
// --document`): a file, read when its turn comes, or text.
struct DocumentRef {
  std::string name;  // unique in the corpus: the file's name, or a text item's `name`
  std::string path;  // the file; empty for text
  // A text item's content (standard input's, for "-"); for a file, its
  // content when it was read already (a `document:` file), else empty.
  std::string text;
  // "file:<path>" or "text", as PipelineSpec::document_source.
  std::string source() const { return path.empty() ? std::string("text") : "file:" + path; }
  bool operator==(const DocumentRef&) const = default;
};

// The same agents over many documents. `pipeline` holds the settings and
// the per-document agents (its document empty: each document's run fills
// it); `reduce` the agents with `scope: corpus`, run once after the
// per-document agents they name, on their own prompt (no document). In
// their prompts `{{a[*]}}` is agent a's answer in every document, in order,
// each after a "### <document name>" line; `{{a@name}}` its answer in the
// document `name`; both take a field after them (`{{a[*].level}}`,
// `{{a@lease.txt.level}}`); `{{r}}` names another reduce agent (in its
// depends_on, as in a pipeline).
struct CorpusSpec {
  PipelineSpec pipeline;
  std::vector<DocumentRef> documents;
  std::vector<AgentSpec> reduce;
  bool listed = false;  // the file lists its documents (`documents:`), not one `document:`
  bool operator==(const CorpusSpec&) const = default;
};

// A pipeline file as a corpus: `documents:` (a list of files, globs and
// folders, relative to the file, and {file: PATH} or {text: ..., name: N}
// items), or `document:` as a corpus of one; agents with `scope: corpus`
// go to `reduce`. Files are checked (they exist, are regular, readable,
// with no NUL byte in their first 4 KiB) but not read. Throws what
// load_pipeline_file throws, and Error(kInvalidArgument) for a glob or
// folder that matches no file, a missing, unreadable or binary file, two
// documents of one name, and what validate_corpus throws.
CorpusSpec load_corpus_file(const std::string& path);
// The documents that `run --document` names: a file, a glob (a folder
// lists its files) or "-" for standard input (read here), relative to the
// current directory; checked as load_corpus_file checks them. Names must
// be unique across `args`.
std::vector<DocumentRef> documents_from_args(const std::vector<std::string>& args);
// A corpus's checks without a model: the per-document pipeline as
// validate_pipeline checks it (but for `needs.until`, checked per
// document), at least one document, unique document names, and the
// reduce agents: names unique among all agents, each placeholder a reduce
// agent among its depends_on or a per-document agent with [*] or @<a
// document's name>. Throws Error(kInvalidArgument) or Error(kGraph).
void validate_corpus(const CorpusSpec& corpus);

// One document's pipeline: the corpus's settings and per-document agents
// with `text` (`d`'s, read by the caller) as its document.
PipelineSpec document_pipeline(const CorpusSpec& corpus, const DocumentRef& d, std::string text);

// The reduce agents as the pipeline they run as: the corpus's settings and
// system prompt, no document (PipelineSpec::no_document), the agents with
// the per-document names left out of their depends_on (those are done
// before it starts), each corpus placeholder in `inputs` with the value
// `inputs` gives it (empty when it has none: enough for validate_pipeline).
// `keep` chooses the agents (all when empty; one flag per reduce agent).
PipelineSpec reduce_stage(const CorpusSpec& corpus,
                          const std::map<std::string, std::string>& inputs = {},
                          const std::vector<bool>& keep = {});

// A reduce agent's placeholder that takes a per-document agent's answers:
// `{{agent[*]field}}` (`document` empty: every document's) or
// `{{agent@document field}}` (the document of that name; the longest name
// that `text` continues with). `field` is a path as PlaceholderRef's.
struct CorpusPlaceholder {
  std::string agent;
  std::string document;
  std::string field;
};
// `{{text}}` in a reduce agent's prompt as a CorpusPlaceholder, nullopt
// when it does not name a per-document agent. Throws Error(kGraph) for
// `{{a}}` alone (which document's?), a document name that no document has,
// a field path that does not parse.
std::optional<CorpusPlaceholder> corpus_placeholder(const CorpusSpec& corpus,
                                                    std::string_view text);

// `spec` as it runs on `model` (EngineSettings::settle_exact): itself, or,
// when exact is off there, a copy in `storage` with exact off. Throws what
// settle_exact throws.
// Every runner (run_pipeline, prepare_pipeline, prefill_document, the
// coordinator) settles its spec so.
const PipelineSpec& exact_settled(const PipelineSpec& spec, const Model& model,
                                  std::optional<PipelineSpec>& storage);

// Loads a pipeline file and checks it with validate_pipeline: a file whose
// name ends in .json is read as JSON (read_pipeline_json, then
// parse_pipeline_json), any other as YAML; both by the same rules. Relative `document.file` and
// `model` paths are resolved against the file's directory. Throws Error(kNotFound) for a missing
// file (or document file), Error(kInvalidArgument) for a directory, for malformed content naming
// the file, the key and its line (unknown or repeated keys, empty values, wrong types, numbers out
// of range), and what validate_pipeline throws, prefixed with the file's path.
PipelineSpec load_pipeline_file(const std::string& path);

// The same from text: `origin` names it in messages, `base_dir` resolves
// relative paths; the pipeline's default name is "pipeline".
PipelineSpec parse_pipeline(const std::string& yaml, const std::string& origin,
                            const std::string& base_dir);

// JSON text as a pipeline's tree for parse_pipeline_json: JSON's own rules
// (surrogate pair escapes are one character), and besides them a key given
// twice in one object and nesting deeper than 16 levels are refused. Keys
// keep their order (a json_schema's properties are generated in it). Throws
// Error(kInvalidArgument) "<origin>: not JSON (<why>)".
nlohmann::ordered_json read_pipeline_json(std::string_view text, const std::string& origin);

// parse_pipeline from JSON already parsed (read_pipeline_json, a request
// body, a job message): the same keys, checks and messages, except that
// JSON keeps no line numbers, so messages name the key alone.
PipelineSpec parse_pipeline_json(const nlohmann::json& pipeline, const std::string& origin,
                                 const std::string& base_dir);
PipelineSpec parse_pipeline_json(const nlohmann::ordered_json& pipeline, const std::string& origin,
                                 const std::string& base_dir);
// The same as a corpus (load_corpus_file's rules): `documents` and agents
// with `scope: corpus` allowed, one `document` a corpus of one. POST
// /v1/pipelines reads a corpus so.
CorpusSpec parse_corpus_json(const nlohmann::ordered_json& pipeline, const std::string& origin,
                             const std::string& base_dir);

// `spec` as the JSON of a pipeline file, every setting written out and the
// document as {"text": ...}, an agent's json_schema as its JSON text (an
// object here would sort its keys): parse_pipeline_json of it gives back
// `spec` except document_source (which becomes "text"). `model` is left out when
// empty. The cluster's job messages and POST /v1/pipelines carry this form.
nlohmann::json pipeline_json(const PipelineSpec& spec);
// An agent's `needs` as the pipeline file writes it: {"tokens": N} or
// {"until": "text"}; null when it has none (the whole document).
nlohmann::json needs_json(const DocumentNeeds& needs);

}  // namespace swarmkv

namespace swarmkv {

// How a branch worker shares the engine under kHost/kNone (kShared has one
// thread, the caller's, driving its one context). kSerialized: one worker
// runs the agents one after another. kConcurrent: up to one worker per
// hardware thread, each with its own context, run ready agents at once.
// `wait` in AgentTimings measures what the choice costs.
enum class GuardPolicy { kSerialized, kConcurrent };
std::string_view to_string(GuardPolicy policy) noexcept;
GuardPolicy parse_guard_policy(std::string_view name);

struct AgentResult;

// What a run reports as it goes (RunOptions::on_agent_event).
struct AgentEvent {
  enum class Kind {
    kStarted,  // the agent's own work starts (its sequence or context is its own)
    kToken,    // a token joined its answer
    kDone,     // it has an outcome: `result` holds it (status and error set)
  };
  Kind kind = Kind::kStarted;
  size_t agent = 0;  // index in PipelineSpec::agents
  Token token = -1;  // kToken
  // kToken: the answer's text so far (a stop string, once matched, cut off;
  // it may end inside a UTF-8 character until the next token).
  std::string_view text;
  const AgentResult* result = nullptr;  // kDone; valid during the call only
};

struct RunOptions {
  GuardPolicy guard = GuardPolicy::kSerialized;
  SnapshotOptions snapshot;
  // Called on the thread that prefills the document after each chunk:
  // (tokens done, total), also when a shared fork streams the document with
  // the agents' steps. What it throws fails the document (and so every
  // agent, kDependencyFailed); while streaming, every agent without an
  // outcome fails with it.
  std::function<void(size_t, size_t)> on_prefill_progress;
  // Called for every agent as it starts, for each token it generates and
  // once when it has an outcome (also one that never started: a failed
  // dependency), on the thread that runs it: under kConcurrent from several
  // threads at once. What it throws for kStarted or kToken fails that agent
  // with the thrown error (its dependents then fail too): a caller cancels
  // a run that way. What it throws for kDone is logged and dropped.
  // With an AgentExecutor, kStarted comes when an agent is handed to it and
  // no kToken comes (run_distributed's workers report no tokens).
  std::function<void(const AgentEvent&)> on_agent_event;
};

enum class NodeStatus { kOk, kFailed, kDependencyFailed };
std::string_view to_string(NodeStatus status) noexcept;

// Per-agent timings in milliseconds. Parts that a fork mode does not have
// are 0 (e.g. `prefill` under kHost, `fork` and `restore` under kNone).
struct AgentTimings {
  double wait = 0;     // ready (dependencies done) -> its work starts (a worker / sequence id free)
  double context = 0;  // getting a context (0 when a warm one was reused)
  double prefill = 0;  // kNone only: this agent's own re-prefill of the document
  double fork = 0;  // kHost: copying the snapshot into the branch buffer; kShared: sampler + seq_cp
  double restore = 0;  // kHost: llama_state_set_data into the context
  // Decoding the agent's prompt at positions prefix_len + i; under kShared
  // the step(s) that carried it, shared with the other branches' tokens.
  double prompt = 0;
  double first_token = 0;  // from the start of the agent's own work to its first generated token
  double generate = 0;     // generating the answer
  double total = 0;        // the agent's own work, start to end (excludes `wait`)
  // From the start of the run (model load excluded):
  double started_at = 0;      // its own work started (`wait` after it became ready)
  double first_token_at = 0;  // its first token was ready
  double done_at = 0;         // it finished
  bool operator==(const AgentTimings&) const = default;
};

struct AgentResult {
  std::string name;
  NodeStatus status = NodeStatus::kOk;
  // Set unless ok. kFailed: what stopped the agent (an Error keeps its code,
  // anything else is kInternal). kDependencyFailed: code kDependencyFailed,
  // message "dependency 'd' failed: <d's error as code: message>".
  std::optional<ErrorValue> error;
  std::string answer;
  // The answer is one complete JSON value that satisfies the agent's
  // json_schema (the result's JSON carries it parsed, as `answer_json`).
  bool answer_is_json = false;
  std::vector<Token> tokens;  // the generated tokens
  // With the agent's sampling.top_logprobs >= 0: one per token of `tokens`,
  // its log probability under the model (before penalties, temperature or
  // a grammar) and the likeliest tokens' beside it; else empty.
  std::vector<SampledLogprobs> logprobs;
  // When each of `tokens` was sampled, from the start of the run (ms; a
  // remote worker's run starts when it takes the job).
  std::vector<double> token_at_ms;
  // The prompt as the agent got it: placeholders replaced by the answers.
  std::string prompt_rendered;
  StopReason stop_reason = StopReason::kMaxTokens;
  int32_t prompt_tokens = 0;  // the agent's prompt, template wrapping included
  AgentTimings timings_ms;
  std::string worker;  // run_distributed: the worker that ran it; "" in a local run
  // The agent's place in the graph, from its AgentSpec: who it waited on.
  std::vector<std::string> depends_on;
  std::string fork_from;
  DocumentNeeds needs;
  bool operator==(const AgentResult&) const = default;
};

// One batched llama_decode of the shared fork (ForkMode::kShared).
struct DecodeStep {
  int32_t branches = 0;         // branches with tokens in this step
  int32_t prompt_tokens = 0;    // agent-prompt tokens in the batch
  int32_t generate_tokens = 0;  // one per generating branch
  int32_t document_tokens = 0;  // the document's, while a streaming prefill goes on
  double ms = 0;
};

// How run_distributed moved the document's snapshot (swarmkv/cluster.h).
struct TransferFigures {
  uint64_t bytes = 0;     // the snapshot file
  double publish_ms = 0;  // the coordinator's upload to Redis (0: it was there already)
  double fetch_ms = 0;    // the slowest worker's download (0: every worker had it locally)
  int fetches = 0;        // workers that downloaded it
};

struct PipelineResult {
  std::string pipeline;  // PipelineSpec::name
  std::string model;     // the model file, as loaded (Model::path)
  ForkMode fork = ForkMode::kShared;
  bool exact = false;                // PipelineSpec::exact, as the run really was
  std::string exact_unavailable;     // why exact was asked for but is off, or empty
  std::optional<GuardPolicy> guard;  // the strategies with branch workers (kHost/kNone) only
  int32_t prefix_tokens = 0;         // the document with its template wrapping
  int32_t document_prefills =
      0;  // times (a part of) the document was prefilled (kNone: once per agent)
  std::optional<SnapshotUse> snapshot;  // kShared/kHost
  size_t snapshot_bytes = 0;            // kHost: size of the exported prefill context's state
  uint32_t n_ctx = 0;                   // per context, as llama.cpp really uses it
  uint32_t n_seq_max = 1;               // sequence ids per context (kShared: agents + 1, capped)
  double prepare_ms = 0;                // validation, tokenisation, budget
  // When the document's KV state was ready for the first agent, from the
  // start of the run (kNone: the first agent's own re-prefill).
  double prefill_done_at_ms = 0;
  double prefill_ms = 0;  // kShared/kHost: the one shared prefill; kNone: sum of the re-prefills
  double export_ms = 0;   // kShared/kHost: llama_state_get_data of the prefilled prefix
  double restore_ms = 0;  // kShared: the prefix state into the shared context
  double branch_buffer_ms = 0;  // kHost: allocating and pre-faulting the first branch buffer
  double total_ms = 0;          // the whole run, model load excluded
  // The engine settings of the run's prefill context (EngineSettings::context_options), the
  // threads as the contexts really run them.
  ContextOptions engine;
  // The model as loaded: the layers asked for a GPU and those it holds
  // (Model::offloaded_layers; 0 without a GPU backend).
  int32_t n_gpu_layers = 0;
  int32_t offloaded_layers = 0;

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
  std::optional<TransferFigures> transfer;   // run_distributed only

  bool ok() const noexcept;
};

// p50/p95/p99 by linear interpolation between order statistics (numpy's
// default); all 0 for no values.
struct Percentiles {
  double p50 = 0, p95 = 0, p99 = 0;
};
Percentiles percentiles(std::vector<double> values);

// Latency over the agents that finished ok, in ms.
struct LatencySummary {
  size_t agents = 0;        // agents counted
  Percentiles queue;        // ready -> its work started (AgentTimings::wait)
  Percentiles ttft;         // the start of the run -> its first token
  Percentiles inter_token;  // every gap between two consecutive tokens, all agents pooled
  Percentiles completion;   // the start of the run -> done
};
LatencySummary latency_summary(const PipelineResult& result);

// The token budget of a pipeline, computed before anything is allocated.
// kHost/kNone: every context holds the prefix and one agent:
//   required = prefix_tokens + max_branch_tokens + max_new_tokens.
// kShared: one context holds the prefix once and every branch:
//   required = prefix_tokens + sum_branch_tokens.
struct PipelineBudget {
  ForkMode fork = ForkMode::kShared;
  int32_t prefix_tokens = 0;
  int32_t max_branch_tokens = 0;  // longest agent prompt (with template wrapping)
  int32_t max_new_tokens = 0;     // the largest max_tokens
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
  // One per agent, same order. Empty for an agent whose prompt has
  // placeholders: it is tokenised when the agent starts.
  std::vector<std::vector<Token>> branches;
  // The prompt tokens the budget counts per agent: branches[i].size(), or
  // for placeholders the prompt without them plus each named agent's
  // max_tokens.
  std::vector<int32_t> budgeted_prompt_tokens;
  std::string branch_tail;  // the template's markup that closes every agent prompt
  // The template's markup between an answer and the next user turn's text
  // (fork_from; "" when no agent forks from another).
  std::string turn_close;
  // Per agent: the prefix tokens it reads, prefix.size() unless it has
  // `needs`; then the prefix cut after the document tokens it needs, and its
  // branch starts with doc_close.
  std::vector<int32_t> watermarks;
  // Set when an agent has `needs` (else empty and 0):
  std::vector<Token> doc_close;  // the template's markup after the document, as tokens
  int32_t document_begin = 0;    // prefix tokens before the document's first
  int32_t document_tokens = 0;   // prefix tokens made from the document alone
  PipelineBudget budget;
};

// Checks `spec` without a model. Throws Error: kInvalidArgument ("the
// document is empty (<source>)", a NUL byte in the document, system prompt
// or a prompt (require_text), n_batch < 1, threads (validate_threads), "the
// pipeline has no agents", an agent's empty name or prompt, a name that is
// not valid UTF-8 on one line, reserved name, max_tokens < 1, an empty stop
// string, sampling settings as validate_sampling names them, max_live < 0),
// kGraph (duplicate name, unknown dependency or fork_from, cycle; see the messages in
// src/pipeline/dag.h; "agent 'a': placeholder {{b}} names unknown agent
// 'b'", "agent 'a': placeholder {{b}} names agent 'b', which is not among
// its dependencies (add 'b' to depends_on)").
void validate_pipeline(const PipelineSpec& spec);

// The budget of `fork`'s layout for these token counts (one entry per agent
// in both vectors); `n_ctx` 0 = the smallest multiple of 256 that fits.
// Throws Error(kBudget): "context budget exceeded: prefix_tokens P +
// max_branch_tokens B + max_new_tokens M = required R > n_ctx N" (kHost/kNone)
// or "context budget exceeded (fork shared, one context for all):
// prefix_tokens P + branch_tokens S (prompt + max_tokens of A agents) =
// required R > n_ctx N" (kShared).
PipelineBudget plan_budget(ForkMode fork, int32_t prefix_tokens,
                           const std::vector<int32_t>& prompt_tokens,
                           const std::vector<int32_t>& max_tokens, uint32_t n_ctx);

// validate_pipeline, tokenisation with the chat template, plan_budget;
// allocates no context or buffer. The document, the system prompt and the
// agent prompts are tokenised as plain text (a document holding
// "<|im_end|>" gets no end-of-turn token from it); only the template's own
// markers become control tokens. Throws what those throw,
// Error(kChatTemplate) when the template drops the document or the agent
// prompt, and Error(kBudget) "agent 'a' needs P positions: prefix_tokens D +
// prompt_tokens Q + max_tokens M > n_ctx_train T, ..." when one sequence
// would run past the context the model was trained on, and
// Error(kInvalidArgument) for an exact pipeline on a model loaded without
// batch-invariant kernels that could have had them (exact_settled).
PreparedPipeline prepare_pipeline(const PipelineSpec& spec, const Model& model);

// What a run of `spec` with `budget` allocates, estimated before anything
// is (estimate_context_memory; kShared: the prefill and the shared context;
// kHost: plus the snapshot and a branch buffer per worker; kHost/kNone with
// kConcurrent: one context per worker): the bytes, without headroom, and
// the parts in words ("1 context(s) x n_ctx 4096: KV 0.09 GiB + ...").
struct MemoryEstimate {
  uint64_t bytes = 0;
  std::string parts;
};
MemoryEstimate estimate_memory(const PipelineSpec& spec, const Model& model,
                               const PipelineBudget& budget, GuardPolicy guard);

// Refuses a run whose contexts and host buffers would not fit in the memory
// left (available_memory()), estimated before anything is allocated
// (estimate_context_memory; kShared: the prefill and the shared context;
// kHost: plus the snapshot and a branch buffer per worker; kHost/kNone with
// kConcurrent: one context per worker). Throws Error(kBudget) "not enough
// memory: fork F needs about X GiB (<the parts>) but Y GiB is available
// (<which limit>); ...". run_pipeline calls it after prepare_pipeline.
void check_memory(const PipelineSpec& spec, const Model& model, const PipelineBudget& budget,
                  GuardPolicy guard);

// The document's prefix tokens (system prompt, document, template wrapping)
// exactly as prepare_pipeline makes them; the agents are not looked at.
// Throws Error(kInvalidArgument) for an empty document, kChatTemplate,
// kTokenize.
std::vector<Token> prepare_prefix(const PipelineSpec& spec, const Model& model);

struct PrefillReport {
  SnapshotUse snapshot;
  int32_t prefix_tokens = 0;
  double prefill_ms = 0;  // decoding snapshot.prefilled_tokens
  double export_ms = 0;   // the state out of the prefill context
  double write_ms = 0;    // writing `out_path`
  std::string out_path;   // "" when none was asked for
};

// Makes the document's prefix state without running agents, the way a
// kShared/kHost run would (options.snapshot: the store is looked up, what is
// missing prefilled, the result published when the cache is kOn), and
// writes it to `out_path` too when that is not empty. Throws what
// prepare_prefix and the snapshot functions throw.
PrefillReport prefill_document(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                               const RunOptions& options, const std::string& out_path = {});

// The first error of a run from a snapshot that the snapshot's state caused
// (kCorruption: its file damaged, its cells elsewhere after the restore,
// non-finite logits), in the document node or an agent; null if none.
const ErrorValue* state_error(const PipelineResult& result);

// Runs the pipeline: prepare, then the fork strategy of spec.fork. Throws
// only what prepare_pipeline throws; failures while running are reported per
// node in the result. A store entry (options.snapshot.cache kOn) whose state
// failed so, though it passed its checksums, is removed and listed in
// result.snapshot->discarded: the next run prefills instead of failing on it
// again (an explicit --snapshot file is left as it is).
PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options = {});
// The same with the preparation done by the caller (to refuse a request
// before anything starts): `prepared` must be prepare_pipeline(spec, *model).
PipelineResult run_pipeline(const PipelineSpec& spec, const PreparedPipeline& prepared,
                            const std::shared_ptr<const Model>& model,
                            const RunOptions& options = {});

// Runs agents outside this process (cluster::run_distributed's coordinator
// is one). run_pipeline with an executor prepares the pipeline, fills the
// result's header, keeps the DAG (what is ready, each node's status and
// error, the events) and offers the document's snapshot; the executor only
// runs the agents it is handed and reports their results.
class AgentExecutor {
 public:
  virtual ~AgentExecutor() = default;

  // What the runner offers the executor about the document (DAG node 0).
  struct Document {
    // snapshot_key of the prefix state the agents fork from; "" when the
    // fork mode keeps none (fork_traits(...).prefix_state false).
    std::string snapshot_key;
    // The snapshot file's bytes (encode_snapshot) of that state, obtained
    // as RunOptions::snapshot says (store, file or prefill) on the first
    // call and kept for later ones; records the prefill and the snapshot's
    // use in the result. Throws what obtaining it throws. Empty when
    // snapshot_key is.
    std::function<std::span<const uint8_t>()> snapshot;
    Clock::time_point started;  // the run's start, for AgentTimings::done_at
  };

  // Refuses what this executor cannot run, before anything is prepared:
  // throws Error(kInvalidArgument).
  virtual void check(const PipelineSpec& spec) const = 0;
  // Once, before any agent: makes the document available to the agents and
  // writes the result's header fields it owns. Returns the document's
  // error (every agent then fails with kDependencyFailed), nullopt when it
  // is available. Throws Error when the run cannot go on at all.
  virtual std::optional<ErrorValue> start(const Document& document, PipelineResult& result) = 0;
  // Hands over agents (indexes into spec.agents) whose dependencies succeeded.
  virtual void submit(const std::vector<size_t>& agents) = 0;
  // Waits a bounded time (about a second) and returns the results of
  // agents that finished since the last call, each agent once. Throws
  // Error when the run cannot go on (a timeout, no one to run the agents).
  virtual std::vector<std::pair<size_t, AgentResult>> collect() = 0;
  // After the last agent's result: releases what start and submit made.
  virtual void finish(PipelineResult& result) = 0;
};

// run_pipeline with `executor` running the agents: no local context is
// made (check_memory is not called) but for the document's snapshot, when
// the executor asks for it. Throws what prepare_pipeline and the executor
// throw.
PipelineResult run_pipeline(const PipelineSpec& spec, const std::shared_ptr<const Model>& model,
                            const RunOptions& options, AgentExecutor& executor);

}  // namespace swarmkv
