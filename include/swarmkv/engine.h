// The engine layer: SwarmKV's only door to llama.cpp.
//
// Exactly one translation unit (src/engine/engine.cpp) includes llama.h. Every
// llama.cpp handle (model, context, batch, sampler) is owned here by an RAII
// class; nothing else in SwarmKV frees an engine handle. All failures are
// reported as swarmkv::Error, and llama.cpp return codes are mapped to it in
// one place (engine.cpp, check_decode()).
//
// Thread rules (from llama.cpp's maintainers): a Model is immutable and may be
// shared by any number of threads; a Context, Batch or Sampler is
// thread-confined: one thread at a time, never two at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

struct llama_model;
struct llama_context;
struct llama_sampler;
struct llama_token_data;
struct llama_token_data_array;

namespace swarmkv {

using Token = std::int32_t;  // llama_token
using Pos = std::int32_t;    // llama_pos: absolute position in a sequence

// How many leading tokens `a` and `b` share.
inline size_t common_prefix(std::span<const Token> a, std::span<const Token> b) noexcept {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}
using SeqId = std::int32_t;  // llama_seq_id

// Options for Model::load.
struct ModelOptions {
  // Layers a GPU build of llama.cpp puts on the GPU, counted as llama.cpp
  // does (the output layer is one of them: n_layer + 1 is all of them, as is
  // -1); 0 = CPU only: no layer and no operation on a GPU. Without a GPU
  // backend, Model::load says so once and runs every layer on the CPU.
  int32_t n_gpu_layers = 0;
  // Kernels whose result for a row does not depend on how many rows share
  // the call (exact mode, the default; model_options in pipeline.h). By
  // default llama.cpp picks the kernel by the number of rows — repacked
  // quantised weights (its "extra buffer types"), ggml's tiled K-quant
  // matmul from 8 rows, llamafile's sgemm from 2 rows, ggml's vec_dot for
  // one — and each rounds a row differently. On: only the weights whose
  // repacked kernels round a row alike at every row count are repacked
  // (Q4_0 and IQ4_NL; none with a llama.cpp without our patches) and,
  // process-wide, GGML_CPU_SGEMM_SINGLE_ROW=1, GGML_CPU_TILED_MM=0 (only
  // where the tiles lack our patch) and
  // (unless set) GGML_CPU_FA_BATCH_INVARIANT=1 (our llama.cpp patches),
  // which ggml reads once, at the first such kernel: Model::load with this
  // on throws Error(kInvalidArgument) once any context of the process
  // exists, unless the three variables were set already. Where
  // exact_unavailable() names a reason (a llama.cpp without our patches,
  // layers on a GPU), Model::load loads the model without them instead
  // (Model::options().batch_invariant false, Model::exact_unavailable()).
  bool batch_invariant = true;
  // The vocabulary, the hyperparameters and the metadata, no weights in
  // memory (llama.cpp's no_alloc): tokenising, the chat template and the KV
  // layout (so snapshot keys) work, decoding does not (a Context on it
  // throws Error(kInvalidArgument)). A cluster's coordinator loads its
  // model so: the workers prefill and decode.
  bool metadata_only = false;
};

// Why a model loaded with `options` cannot have batch-invariant kernels
// here, or empty when it can: the linked llama.cpp lacks our patches
// (scripts/patches/; ggml_cpu_has_fa_batch_invariant is their mark), or
// options.n_gpu_layers puts layers on a GPU (the kernels are CPU-only).
std::string exact_unavailable(const ModelOptions& options);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

namespace detail {
struct ModelDeleter {
  void operator()(llama_model* model) const noexcept;
};
struct ContextDeleter {
  void operator()(llama_context* ctx) const noexcept;
};
struct SamplerDeleter {
  void operator()(llama_sampler* sampler) const noexcept;
};
// The engine layer's own door to the llama.cpp handles (engine.cpp).
struct EngineAccess;
}  // namespace detail

// A loaded GGUF model. Immutable after load. Thread-safe.
class Model {
 public:
  // Loads `path`. Throws Error: kNotFound when the file does not exist,
  // kModelLoad when llama.cpp rejects it (not a GGUF, unsupported
  // architecture, truncated). Nothing is left allocated on failure.
  static std::shared_ptr<const Model> load(const std::string& path,
                                           const ModelOptions& options = {});

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  ~Model();

  const std::string& path() const noexcept { return path_; }
  // As loaded: batch_invariant is off when the request could not be met.
  const ModelOptions& options() const noexcept { return options_; }
  // Why batch_invariant was asked for but is off (exact_unavailable), or
  // empty.
  const std::string& exact_unavailable() const noexcept { return exact_unavailable_; }
  // The transformer layers whose weights and K/V a GPU holds: 0 without a
  // GPU backend or with options().n_gpu_layers 0.
  int32_t offloaded_layers() const noexcept { return offloaded_layers_; }
  std::string description() const;  // e.g. "llama ?B Q4_1"
  int32_t n_vocab() const noexcept;
  int32_t n_ctx_train() const noexcept;
  int32_t n_layer() const noexcept;
  int32_t n_head() const noexcept;
  uint64_t size_bytes() const noexcept;

  // Text -> tokens. `add_special` adds BOS/EOS where the model wants them;
  // `parse_special` turns control-token text (e.g. "<|im_start|>") into the
  // control token. Throws Error(kTokenize) on failure.
  std::vector<Token> tokenize(std::string_view text, bool add_special,
                              bool parse_special = true) const;
  // A text assembled from pieces: a chat template's own markup, where the
  // texts of special tokens ("<|im_start|>", "<start_of_turn>") become those
  // tokens, and content (a document, a prompt), which is always plain text,
  // so that an untrusted document cannot open or close a turn. For content
  // without special-token texts the result equals tokenize() of the whole
  // text with parse_special. Control-token texts in markup are matched
  // longest first at each position; the LSTRIP/RSTRIP whitespace rules of a few tokenizers (Phi-3,
  // BERT masks) are not applied. Throws Error(kTokenize) on failure.
  struct TextPiece {
    std::string_view text;
    bool markup = false;
  };
  std::vector<Token> tokenize(std::span<const TextPiece> pieces, bool add_special) const;
  // `rendered` (a chat template's output made with placeholder markers in
  // place of the messages' contents) as pieces: the template's text as
  // markup, each marker found, in order, replaced by its content. A marker
  // the template dropped is skipped. The pieces view `rendered` and the
  // contents.
  using Placeholder = std::pair<std::string_view, std::string_view>;  // marker, content
  static std::vector<TextPiece> fill_placeholders(std::string_view rendered,
                                                  std::span<const Placeholder> placeholders);
  // True for control tokens (the chat template's markers, BOS, EOS, ...).
  bool is_control(Token token) const;
  // One token -> its text piece. `special` renders control tokens.
  std::string token_to_piece(Token token, bool special = false) const;
  // Tokens -> text. Throws Error(kTokenize) on an invalid token.
  std::string detokenize(std::span<const Token> tokens, bool special = false) const;
  // True for end-of-generation tokens (EOS, EOT, <|im_end|>, ...).
  bool is_eog(Token token) const;

  // True when the GGUF carries a chat template that llama.cpp can apply.
  bool has_chat_template() const;
  // Formats `messages` with the model's own chat template; with
  // `add_assistant` the result ends with the assistant turn's opening.
  // Throws Error(kChatTemplate) when the model has no usable template.
  std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_assistant) const;

 private:
  friend struct detail::EngineAccess;
  Model(std::string path, llama_model* model, ModelOptions options);

  std::string path_;
  ModelOptions options_;
  std::string exact_unavailable_;
  int32_t offloaded_layers_ = 0;
  std::unique_ptr<llama_model, detail::ModelDeleter> model_;
  // The control and unknown tokens' texts, longest first (tokenize(pieces)).
  // Set once by load(); immutable after.
  std::vector<std::pair<std::string, Token>> control_texts_;
};

// The element type of a KV cache. kQ8_0 halves the cache (and every
// snapshot of it) against kF16; at the pinned llama.cpp a quantised V cache
// needs flash attention.
enum class KvType { kF16, kQ8_0 };
std::string_view to_string(KvType type) noexcept;
// Parses "f16" or "q8_0"; throws Error(kInvalidArgument) naming them.
KvType parse_kv_type(std::string_view name);

// Options for Context; after construction Context::options() holds the
// values really in use (llama.cpp may pad n_ctx).
struct ContextOptions {
  uint32_t n_ctx = 4096;    // KV cache size in tokens, all sequences together
  uint32_t n_batch = 512;   // most tokens one llama_decode call may carry
  uint32_t n_ubatch = 512;  // physical micro-batch size (<= n_batch)
  uint32_t n_seq_max = 1;   // distinct sequence ids the context may hold
  int32_t n_threads = 0;    // CPU threads; 0 = all hardware threads; capped by $SWARMKV_MAX_THREADS
  // Threads for micro-batches of more than one token (a prefill, a batched
  // step of several branches); 0 = n_threads. Capped like n_threads.
  int32_t n_threads_batch = 0;
  bool kv_unified = false;  // one KV stream shared by all sequences
  bool flash_attn = false;  // flash attention: faster prefill on CPU; other numerics than off
  KvType type_k = KvType::kF16;
  KvType type_v = KvType::kF16;  // kQ8_0 requires flash_attn
};

// What decides whether a context's KV state bytes mean the same thing in
// another context: the model's attention shape and the context settings that
// change the bytes or the numerics. Snapshots record it and are refused by a
// context whose layout differs (snapshot.h).
struct KvLayout {
  std::string architecture;  // GGUF general.architecture, e.g. "llama", "gemma3"
  int32_t n_layer = 0;
  int32_t n_embd_k = 0;  // K values per token and layer (KV heads x key length)
  int32_t n_embd_v = 0;  // V values per token and layer
  std::string type_k;    // ggml type of the K cache, e.g. "f16"
  std::string type_v;
  bool flash_attn = false;
  bool kv_unified = false;
  int32_t n_swa = 0;             // sliding-window size in tokens; 0: no sliding-window layers
  uint32_t n_ubatch = 0;         // micro-batch size: decides how a prefill is chunked
  bool batch_invariant = false;  // ModelOptions::batch_invariant: other matmul kernels
  // Flash attention ran on the batch-invariant kernel (flash_attn and
  // attention_batch_invariant()): other bits than ggml's own kernels.
  bool attention_invariant = false;
  // Layers whose K/V a GPU computed (Model::offloaded_layers): other
  // rounding than the CPU's, so a state made on one device is not the
  // state a prefill on the other makes.
  int32_t offloaded_layers = 0;
  bool operator==(const KvLayout&) const = default;
};

// The KV layout a context with `options` on `model` has (no context needed).
KvLayout kv_layout(const Model& model, const ContextOptions& options);

// Whether flash attention gives a query row the same bits whatever the
// other rows of its decode call (any number of them), the cells of other
// sequences between its own and the thread count: true when the linked
// ggml has our batch-invariant kernel
// (scripts/patches/ggml-fa-batch-invariant.patch) and
// GGML_CPU_FA_BATCH_INVARIANT is set and not 0, as the kernel reads it
// (Model::load with ModelOptions::batch_invariant sets it to 1 where it is
// unset). Without it
// flash attention is batch-invariant only on 2 to 63 rows and on one thread.
// Either way a row's result depends on the order of its own cells.
bool attention_batch_invariant() noexcept;

// Hardware threads of this machine (at least 1): the most `n_threads` a
// context accepts.
int32_t hardware_threads() noexcept;
// The threads a context really runs with for `n_threads`: 0 = all hardware
// threads, capped by $SWARMKV_MAX_THREADS when that is set.
int32_t effective_threads(int32_t n_threads) noexcept;
// Throws Error(kInvalidArgument) unless 0 <= n_threads <= hardware_threads():
// "threads must be 0 (all cores) or 1..H, this machine's hardware threads
// (got N)". More threads than cores only slows llama.cpp down.
void validate_threads(int32_t n_threads);
// Throws Error(kInvalidArgument) naming the field: n_ctx, n_batch, n_ubatch
// and n_seq_max >= 1, validate_threads(n_threads) and (n_threads_batch), and
// a quantised V cache only with flash attention.
void validate_context_options(const ContextOptions& options);
// The V-cache rule alone: "kv_type q8_0 needs flash attention ...".
void validate_kv_types(KvType type_k, KvType type_v, bool flash_attn);

// The engine settings a run or a server chooses (docs/engine-settings.md;
// the defaults are the fastest end to end in bench/results/prefill-settings):
// the one value every context and model option of `run`, `serve`, the
// cluster and a snapshot's prefill is derived from, so that they bind alike
// (a snapshot binds to them). PipelineSpec has them as its base.
struct EngineSettings {
  uint32_t n_batch = 512;  // prefill chunk size (a shared fork: at least n_seq_max)
  // The prefill's micro-batch, dividing n_batch; 0 = 256 when it divides
  // n_batch (5-9 % faster than 512 here), else n_batch (auto_n_ubatch).
  uint32_t n_ubatch = 0;
  int32_t n_threads = 0;        // decode threads; 0 = all cores
  int32_t n_threads_batch = 0;  // prefill (and batched-step) threads; 0 = n_threads
  // Off: on, the prefill is 1.2-1.4x faster but the agents' decoding 2.2-4x
  // slower (f16 cache), a net loss end to end on the README pipeline.
  bool flash_attn = false;
  // K and V cache; unset: kQ8_0 where flash attention runs (exact mode
  // turns it on), else kF16 (a quantised V cache needs flash attention).
  // Under the exact kernels q8_0 halves the KV memory and every snapshot at
  // f16's speed on SmolLM2, within a tenth of it on Gemma 3
  // (bench/results/cluster-q8).
  std::optional<KvType> kv_type;
  // Batch-invariant decoding, on by default: every answer equals, token for
  // token, a re-prefill's with the same settings, whatever else shares its
  // decode calls (docs/exact-mode.md). Turns flash attention on
  // (context_options) and loads the model with batch-invariant kernels
  // (model_options); settle_exact turns it off where the model could not be
  // loaded so.
  bool exact = true;
  // Layers on a GPU build's GPU (ModelOptions::n_gpu_layers; 0 = CPU only,
  // -1 = all). Not exact (the kernels are CPU-only); snapshots bind to it
  // (KvLayout::offloaded_layers).
  int32_t n_gpu_layers = 0;

  // Throws Error(kInvalidArgument) naming the setting: n_batch >= 1,
  // n_ubatch 0 or a divisor of n_batch (so that every prefill's
  // micro-batches start at multiples of n_ubatch, which snapshot reuse
  // relies on), threads and threads_batch (validate_threads), kv_type q8_0
  // only with flash attention (or exact, which turns it on).
  void validate() const;
  // As context options: n_batch, n_ubatch, threads, flash attention and KV
  // types (n_ctx, n_seq_max and kv_unified left at their defaults for the
  // caller to set); threads resolved (0: all cores), the KV type too. With
  // exact: flash attention on, and n_threads 1 where our attention kernel
  // is missing (flash attention's split-KV path over 512 or more cells
  // starts its chunks at absolute cell indices; one thread reads the row
  // kernel every other step uses).
  ContextOptions context_options() const;
  // How to load the model: with batch-invariant kernels when exact.
  ModelOptions model_options() const;
  // These settings as they run on `model`: exact turned off when the model
  // could not be loaded with batch-invariant kernels
  // (Model::exact_unavailable names why). Throws Error(kInvalidArgument)
  // when exact is asked of a model that could have had them but was loaded
  // without (ModelOptions::batch_invariant false).
  EngineSettings settle_exact(const Model& model) const;
  bool operator==(const EngineSettings&) const = default;
};

// The micro-batch of a prefill in chunks of n_batch when none is given
// (EngineSettings::n_ubatch 0): 256 when it divides n_batch, else n_batch.
uint32_t auto_n_ubatch(uint32_t n_batch);

// What a context with `options` allocates, estimated before it exists from
// the model's shape: the KV cache (n_ctx cells x layers x K and V widths x
// their type sizes) and, without flash attention, the compute buffer's
// attention scores and masks (n_ctx x n_ubatch x (heads + masks) x 4 bytes).
// Within a few percent of the buffer sizes llama.cpp logs for both test
// models (NOTES.md, "Memory is refused up front").
struct ContextMemory {
  uint64_t kv_bytes = 0;
  uint64_t compute_bytes = 0;
  uint64_t total() const noexcept { return kv_bytes + compute_bytes; }
};
ContextMemory estimate_context_memory(const Model& model, const ContextOptions& options);

// A batch of tokens for Context::decode. Owns its llama_batch.
// Thread-confined.
// One token of a decode call given as values (Context::decode).
struct BatchToken {
  Token token = -1;
  Pos pos = 0;
  SeqId seq = 0;
  bool logits = false;  // keep its output row
};

class Batch {
 public:
  // Room for `capacity` tokens, each tagged with up to `n_seq_max` sequences.
  // Throws Error(kInvalidArgument) when either is < 1.
  explicit Batch(int32_t capacity, int32_t n_seq_max = 1);
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();

  void clear() noexcept;
  // Appends a token at absolute position `pos` for `seqs`; `logits` asks for
  // its output row. Throws Error(kInvalidArgument) when the batch is full or
  // `seqs` is empty or too long.
  void add(Token token, Pos pos, std::span<const SeqId> seqs, bool logits);
  void add(Token token, Pos pos, SeqId seq, bool logits) {
    add(token, pos, std::span(&seq, 1), logits);
  }

  int32_t size() const noexcept;
  int32_t capacity() const noexcept { return capacity_; }

 private:
  friend struct detail::EngineAccess;
  struct Impl;  // the llama_batch (engine.cpp)
  int32_t capacity_;
  int32_t n_seq_max_;
  std::unique_ptr<Impl> impl_;
};

// A llama.cpp context: the KV cache and compute state. Thread-confined.
class Context {
 public:
  // Creates a context on `model`. Throws Error(kInvalidArgument) for
  // inconsistent options and Error(kContextCreate) when llama.cpp refuses.
  Context(std::shared_ptr<const Model> model, const ContextOptions& options);
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ~Context();

  const ContextOptions& options() const noexcept { return options_; }
  const Model& model() const noexcept { return *model_; }
  // This context's KV layout: kv_layout(model(), options()).
  KvLayout kv_layout() const;

  // Decodes `tokens` on sequence `seq` at absolute positions pos0, pos0+1, ...
  // in chunks of at most n_batch tokens (and at most `max_chunk`, when not
  // 0: one llama_decode, so one micro-batch, per chunk). With `logits_last` the last token's
  // logits are kept (read them with logits(-1)). Throws Error(kBudget) when
  // pos0 + tokens.size() exceeds n_ctx, before decoding anything; on a decode
  // failure (kNoKvSlot, kAborted, kInvalidBatch, kDecodeFatal) the chunks
  // decoded before the failing one stay in the KV cache. `progress`, when
  // set, is called after each chunk with (tokens decoded, tokens in total).
  void decode_prompt(std::span<const Token> tokens, Pos pos0, SeqId seq, bool logits_last = true,
                     const std::function<void(size_t, size_t)>& progress = {},
                     uint32_t max_chunk = 0);

  // Decodes one batch (at most n_batch tokens). Errors as for decode_prompt;
  // on kNoKvSlot/kInvalidBatch the memory is as before the call.
  void decode(const Batch& batch);
  // The same for tokens given as values, in a batch the context keeps: the
  // one place the library itself fills a llama_batch (decode_prompt's
  // chunks, generate()'s steps, the shared fork's and serve's steps through
  // kv/step_executor.h).
  void decode(std::span<const BatchToken> tokens);

  // Logits of output row `i` of the last decode (-1: the last row).
  // Valid until the next decode. Throws Error(kInvalidArgument) for a row
  // that produced no logits.
  std::span<const float> logits(int32_t i = -1);

  // KV memory of the sequences.
  void memory_clear();
  // Removes positions [p0, p1) of `seq` (-1: open end). Returns false when
  // llama.cpp cannot remove a partial range (recurrent models).
  bool seq_rm(SeqId seq, Pos p0 = -1, Pos p1 = -1);
  // Makes positions [p0, p1) of `src` visible to `dst` as well.
  void seq_cp(SeqId src, SeqId dst, Pos p0 = -1, Pos p1 = -1);
  // Highest / lowest position held for `seq`; -1 when the sequence is empty.
  Pos seq_pos_max(SeqId seq) const;
  Pos seq_pos_min(SeqId seq) const;

  // Exact size in bytes of the state of `seq`, as this llama.cpp build
  // serialises it.
  std::size_t state_seq_size(SeqId seq);
  // Writes the state of `seq` into `dst`; returns the bytes written.
  // Throws Error(kState) when `dst` is too small or nothing was written.
  std::size_t state_seq_get(SeqId seq, std::span<std::uint8_t> dst);
  // Restores a state exported by state_seq_get into `seq`. Throws
  // Error(kState) unless llama.cpp consumed exactly src.size() bytes; after a
  // failure `seq` is empty (llama.cpp clears it), other sequences untouched.
  void state_seq_set(SeqId seq, std::span<const std::uint8_t> src);

  // The whole-context state (state_get's format) a context holding only
  // `seq`'s cells would export: the architecture name, then
  // state_seq_get(seq), whose cells name `seq` alone. Where `seq`'s cells
  // lie in position order and the model has no sliding-window layers (a
  // per-sequence export keeps only the window), it is the state a prefill
  // of the same tokens exports with state_get: check the order with
  // read_state_cells. Throws as state_seq_get.
  std::vector<std::uint8_t> state_get_alone(SeqId seq);

  // The whole context's KV state (every sequence, every cell at its index),
  // as this build serialises it. Unlike state_seq_*, a restore puts each cell
  // back at the index it had, so attention sums in the same order as in the
  // exporting context. Use it for bit-exact forks of a context that holds one
  // sequence: on sliding-window models (Gemma 3) a per-sequence export keeps
  // only the window, and the restore packs it at index 0, which changes the
  // rounding (NOTES.md, "Exact host fork on sliding-window models").
  std::size_t state_size();
  // Writes the whole state into `dst`; returns the bytes written. Throws
  // Error(kState) when `dst` is too small or nothing was written.
  std::size_t state_get(std::span<std::uint8_t> dst);
  // Replaces the whole memory with a state exported by state_get from a
  // context of the same model and shape. Throws Error(kState) unless
  // llama.cpp consumed exactly src.size() bytes, or before llama.cpp reads
  // anything when the state does not begin with this model's architecture
  // name; after a failure the memory is empty.
  void state_set(std::span<const std::uint8_t> src);
  // Reads the cell list of a whole-context state (state_get) without
  // restoring anything: calls `cell(pos, seqs)` for each cell of its first
  // KV cache's first stream, in the state's order. That cache holds every
  // cell the context held (a sliding-window model's window cache comes
  // after it). Returns the state's stream count. Throws Error(kState) as
  // state_set does when the state does not begin with this model's
  // architecture name; Error(kCorruption) when the bytes end inside the
  // list or a cell names more sequences than this context has.
  uint32_t read_state_cells(std::span<const std::uint8_t> src,
                            const std::function<void(Pos, std::span<const SeqId>)>& cell) const;

 private:
  friend struct detail::EngineAccess;
  std::shared_ptr<const Model> model_;  // outlives ctx_: declared first
  ContextOptions options_;
  std::unique_ptr<llama_context, detail::ContextDeleter> ctx_;
  std::unique_ptr<Batch> batch_;  // decode(span): n_batch tokens, made at its first call
};

// Sampling settings for one generation.
struct SamplingOptions {
  float temperature = 0.0f;  // 0: greedy (argmax); otherwise softmax temperature
  float top_p = 1.0f;        // nucleus mass kept; 1 = off
  int32_t top_k = 0;         // keep the k most likely tokens; 0 = off
  float min_p = 0.0f;        // drop tokens below min_p x the likeliest's probability; 0 = off
  uint32_t seed = 42;        // RNG seed for sampled generation
  // Repetition control over the tokens this sampler generated (the document
  // and the prompt are never fed to it). llama.cpp's / llama-server's names;
  // frequency_penalty and presence_penalty are OpenAI's too. Applied before
  // greedy or temperature sampling, so greedy stays deterministic.
  float repeat_penalty = 1.0f;     // divides a repeated token's logit (> 1 penalises); 1 = off
  int32_t repeat_last_n = 64;      // how many of the last generated tokens count; 0 = off
  float frequency_penalty = 0.0f;  // minus this x (times the token occurred); 0 = off
  float presence_penalty = 0.0f;   // minus this once a token occurred; 0 = off
  // DRY ("don't repeat yourself"): penalises the token that would extend a
  // repeated sequence longer than dry_allowed_length, by
  // dry_multiplier * dry_base ^ (length - dry_allowed_length).
  float dry_multiplier = 0.0f;  // 0 = off
  float dry_base = 1.75f;
  int32_t dry_allowed_length = 2;
  int32_t dry_penalty_last_n = 256;  // how many generated tokens DRY looks back over (>= 1)
  // A GBNF grammar (llama.cpp's dialect, start symbol `root`) that the
  // answer must match; empty = free text. Only tokens the grammar allows are
  // sampled, and the end of generation only once it is complete, so an
  // answer that stops otherwise (max_tokens) is incomplete.
  // grammar_from_json_schema makes one from a JSON Schema. Not walked by
  // for_each_sampling_field (it is text, not a number).
  std::string grammar;
  // Added to a token's logit before anything else (greedy included), as
  // OpenAI's logit_bias: (token id, bias); -100 all but bans a token. Not
  // walked by for_each_sampling_field (a list, not a number); the Sampler
  // refuses a token outside the model's vocabulary.
  std::vector<std::pair<Token, float>> logit_bias;
  // Record each sampled token's log probability and this many of the
  // likeliest tokens' (0..20) beside it (Sampler::last_logprobs,
  // Generation::logprobs); -1 = off, which costs nothing. Changes no
  // token: an O(vocabulary) pass over the raw row per token.
  int32_t top_logprobs = -1;

  bool penalties_on() const noexcept {
    return repeat_last_n != 0 &&
           (repeat_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f);
  }
  bool operator==(const SamplingOptions&) const = default;
};

// The one list of the sampling settings, for the encoders that walk them
// (pipeline files, the cluster's JSON): calls f(key, member, least) for each
// field of `s` (SamplingOptions or const SamplingOptions), where key is the
// pipeline file's name, member a reference to the field (float, int32_t or
// uint32_t) and least the smallest value an integer field may take.
template <class Options, class F>
void for_each_sampling_field(Options& s, F&& f) {
  f("temperature", s.temperature, 0);
  f("top_p", s.top_p, 0);
  f("top_k", s.top_k, 0);
  f("min_p", s.min_p, 0);
  f("seed", s.seed, 0);
  f("repeat_penalty", s.repeat_penalty, 0);
  f("repeat_last_n", s.repeat_last_n, 0);
  f("frequency_penalty", s.frequency_penalty, 0);
  f("presence_penalty", s.presence_penalty, 0);
  f("dry_multiplier", s.dry_multiplier, 0);
  f("dry_base", s.dry_base, 0);
  f("dry_allowed_length", s.dry_allowed_length, 1);
  f("dry_penalty_last_n", s.dry_penalty_last_n, 1);
  f("top_logprobs", s.top_logprobs, -1);
}

// The one check of sampling settings. Throws Error(kInvalidArgument): "need
// temperature >= 0, top_p in (0, 1], top_k >= 0 (got T, P, K)", "need min_p
// in [0, 1] (got M)", "need top_logprobs in [-1, 20] (got N)", "logit_bias: need finite biases (got
// B for token T)", with n_vocab > 0 "logit_bias: token T is not in the model's vocabulary (ids 0 to
// V)", or for the repetition settings "need repeat_penalty > 0, repeat_last_n >= 0,
// frequency_penalty and presence_penalty finite (got ...)" / "need
// dry_multiplier >= 0, dry_base >= 1, dry_allowed_length >= 1,
// dry_penalty_last_n >= 1 (got ...)".
void validate_sampling(const SamplingOptions& options, int32_t n_vocab = 0);

// The GBNF grammar (start symbol `root`) of the JSON values that `schema`
// (a JSON Schema, as JSON text) allows: llama.cpp's own converter
// (common/json-schema-to-grammar). Throws Error(kInvalidArgument) for text
// that is not JSON, and for a schema the converter cannot handle, naming
// where ("JSON schema error at /properties/x: unsupported $ref ...").
std::string grammar_from_json_schema(std::string_view schema);

// Throws Error(kInvalidArgument) unless `grammar` (GBNF) parses and names a
// `root` rule for `model`'s vocabulary: the check a run makes before it
// starts, so that a bad grammar fails the run, not an agent in its middle.
void check_grammar(const Model& model, std::string_view grammar);

// A sampled token's log probability under the model's own distribution
// (the softmax of the raw logits: before penalties, temperature or a
// grammar), and the most likely tokens' beside it (OpenAI's logprobs).
struct TokenLogprob {
  Token token = -1;
  float logprob = 0.0f;
  std::string text;  // the token's piece (Model::token_to_piece; may be part of a UTF-8 character)
  bool operator==(const TokenLogprob&) const = default;
};
struct SampledLogprobs {
  TokenLogprob sampled;
  std::vector<TokenLogprob> top;  // most likely first (the lower id first among equals)
  bool operator==(const SampledLogprobs&) const = default;
};

// The log probability of `token` at output row `i` of ctx's last decode,
// and the `top` (0..20) likeliest tokens' beside it, as Sampler records a
// sampled token's, with control tokens' texts rendered: how a prompt's own
// tokens are scored (each at the row before it; `/v1/completions`' echo).
// Throws what Sampler::sample throws for the row, Error(kInvalidArgument)
// for `top` out of range or a token outside the vocabulary.
SampledLogprobs score_token(const Model& model, Context& ctx, int32_t i, Token token, int32_t top);

// A token sampler (llama_sampler chain). Thread-confined.
class Sampler {
 public:
  // `model` supplies the vocabulary the repetition samplers need. Throws
  // what validate_sampling throws.
  Sampler(const Model& model, const SamplingOptions& options);
  Sampler(const Sampler&) = delete;
  Sampler& operator=(const Sampler&) = delete;
  ~Sampler();

  // Samples from output row `i` of ctx's last decode and records the token
  // in the sampler's history. Throws Error(kInvalidArgument) for a row
  // without logits, Error(kCorruption) for a row with a NaN or +Inf logit.
  // With a grammar (SamplingOptions::grammar) the token comes from the
  // distribution restricted to what the grammar allows: the row is sampled
  // as if free first and the token kept when the grammar allows it (llama.cpp's
  // common sampler does the same), else the grammar filters the whole row and
  // it is sampled again. Greedy picks the same token either way.
  Token sample(Context& ctx, int32_t i = -1);
  // Forgets the history (and the grammar's progress) and reseeds.
  void reset();
  // From now on each sample() also records the sampled token's log
  // probability and the `top` likeliest tokens' (0..20; -1: off, the
  // default, which costs nothing): last_logprobs(). The constructor calls
  // it with SamplingOptions::top_logprobs.
  void keep_logprobs(int32_t top);
  // The last sample()'s, when keep_logprobs is on.
  const SampledLogprobs& last_logprobs() const noexcept { return logprobs_; }
  // &last_logprobs() when keep_logprobs is on, else nullptr: what
  // GenerationTracker::accept takes.
  const SampledLogprobs* kept_logprobs() const noexcept {
    return top_logprobs_ >= 0 ? &logprobs_ : nullptr;
  }

 private:
  void record_logprobs(std::span<const float> row, Token token);
  Token sample_with_grammar(std::span<const float> row);
  Token first_allowed_by_logit(const llama_token_data_array& all);

  const Model* model_;  // for the logprobs' token texts
  std::unique_ptr<llama_sampler, detail::SamplerDeleter> chain_;
  std::unique_ptr<llama_sampler, detail::SamplerDeleter> grammar_;  // null: free text
  std::vector<llama_token_data> candidates_;  // the row being sampled, kept for its storage
  bool greedy_ = false;                       // temperature 0
  int32_t top_logprobs_ = -1;                 // keep_logprobs; -1: off
  SampledLogprobs logprobs_;
};

enum class StopReason { kEndOfGeneration, kMaxTokens, kStopString };
std::string_view to_string(StopReason reason) noexcept;

struct GenerateOptions {
  int32_t max_tokens = 128;  // generated tokens at most (>= 1)
  std::vector<std::string>
      stop;  // stop once the answer contains one (it may span tokens); text cut there
  // Called as each token joins the answer (Generation::tokens), on the
  // thread that samples, with the answer's text so far (a stop string the
  // token completed already cut off); may be empty. What it throws
  // propagates out of GenerationTracker::accept (and generate()).
  std::function<void(Token, const std::string& text)> on_token;
};

struct Generation {
  std::vector<Token>
      tokens;        // generated tokens (EOG excluded; the token completing a stop string included)
  std::string text;  // their text, stop string removed
  StopReason stop_reason = StopReason::kMaxTokens;
  // One per token of `tokens`, when the sampler kept them
  // (SamplingOptions::top_logprobs); else empty.
  std::vector<SampledLogprobs> logprobs;
};

// The stop rules of one answer, fed one sampled token at a time. generate()
// drives one; the shared-fork decoder drives one per live branch, all
// sampled from the same batched decode. Not thread-safe.
class GenerationTracker {
 public:
  // Throws Error(kInvalidArgument) when options.max_tokens < 1.
  GenerationTracker(const Model& model, const GenerateOptions& options);

  // Records a sampled token, and its logprobs (Sampler::kept_logprobs; may
  // be null) when it joins the answer. Returns true when the answer is
  // complete (EOG, a stop string, or max_tokens reached); the token must
  // then not be decoded. Returns false when the token should be decoded and
  // another sampled after it.
  bool accept(Token token, const SampledLogprobs* logprobs = nullptr);
  bool done() const noexcept { return done_; }
  size_t n_tokens() const noexcept { return out_.tokens.size(); }
  // The answer's text so far (a stop string, once matched, cut off).
  const std::string& text() const noexcept { return out_.text; }
  // The answer so far; call once, when done() (or to salvage a partial one).
  Generation take() noexcept { return std::move(out_); }

 private:
  const Model* model_;
  GenerateOptions options_;
  Generation out_;
  bool done_ = false;
};

// Generates an answer on `seq`. Precondition: ctx's last decode produced
// logits for the last prompt token of `seq` in output row `first_row`, and
// `next_pos` is the position that follows that token. Throws what
// Context::decode throws (kBudget when next_pos would pass n_ctx); the tokens
// generated so far are then lost with the exception.
Generation generate(Context& ctx, Sampler& sampler, SeqId seq, Pos next_pos,
                    const GenerateOptions& options, int32_t first_row = -1);

// Most sequence ids one context may hold (llama.cpp's LLAMA_MAX_SEQ).
uint32_t max_parallel_sequences() noexcept;

// The llama.cpp build SwarmKV runs on ("<build number> (<commit>)").
std::string engine_build_info();

// What this binary is built from (`swarmkv --version`, the server's
// swarmkv_build_info metric).
struct BuildInfo {
  std::string version;                // SwarmKV's
  std::string llama_commit;           // the pinned llama.cpp commit
  std::string llama_patches;          // the hash of our patches to it (scripts/patches/)
  std::vector<std::string> backends;  // ggml backends compiled in or loaded, e.g. "CPU"
};
BuildInfo build_info();

// One ggml type among a model file's weights.
struct WeightType {
  std::string type;  // ggml type name, e.g. "q4_1"
  int32_t tensors = 0;
  uint64_t bytes = 0;
  // Matrix products of a batch (a prefill) with weights of this type take a
  // fast kernel of this llama.cpp on this CPU: llamafile's tinyBLAS or a
  // repacked layout. Known for x86 CPUs only; false elsewhere.
  bool fast_prefill = false;
};
// The weights of `model`'s file by type, largest first. The token embedding
// is left out: a prefill reads it row by row, not as a matrix product.
// Throws Error(kModelLoad) when the file cannot be read as GGUF.
std::vector<WeightType> weight_types(const Model& model);
// A sentence for users when the types without a fast prefill kernel hold
// at least a quarter of those bytes: which, how much, and which types would
// be fast here; empty otherwise.
std::string slow_weights_hint(const std::vector<WeightType>& types);

// The engine a KV state was made by, as snapshots record it: the llama.cpp
// commit and the hash of SwarmKV's patches to it ("0c1e57098+pe3f6dd2ca631";
// "unknown" parts for a llama.cpp SwarmKV did not build).
std::string engine_id();
// llama.cpp's version of the state format (LLAMA_SESSION_VERSION).
uint32_t engine_state_version() noexcept;

}  // namespace swarmkv
