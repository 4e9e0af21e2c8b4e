// EngineSettings (swarmkv/engine.h): the one derivation of context and
// model options from a run's or a server's engine settings.
#include <fmt/format.h>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv {

void EngineSettings::validate() const {
  if (n_batch < 1)
    throw Error(ErrorCode::kInvalidArgument, fmt::format("n_batch must be >= 1 (got {})", n_batch));
  if (n_ubatch > 0 && n_batch % n_ubatch != 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("n_ubatch must be 0 (automatic) or divide n_batch {} (got {})", n_batch,
                            n_ubatch));
  }
  validate_threads(n_threads);
  validate_threads(n_threads_batch);
  if (kv_type) validate_kv_types(*kv_type, *kv_type, flash_attn || exact);
}

uint32_t auto_n_ubatch(uint32_t n_batch) {
  constexpr uint32_t kAutoUbatch = 256;
  return n_batch % kAutoUbatch == 0 ? kAutoUbatch : n_batch;
}

ContextOptions EngineSettings::context_options() const {
  ContextOptions o;
  o.n_batch = n_batch;
  o.n_ubatch = n_ubatch > 0 ? n_ubatch : auto_n_ubatch(n_batch);
  o.n_threads = effective_threads(n_threads);
  o.n_threads_batch = n_threads_batch > 0 ? effective_threads(n_threads_batch) : o.n_threads;
  o.flash_attn = flash_attn;
  if (exact) {
    if (!attention_batch_invariant()) o.n_threads = 1;
    o.flash_attn = true;
  }
  o.type_k = o.type_v = kv_type.value_or(o.flash_attn ? KvType::kQ8_0 : KvType::kF16);
  return o;
}

ModelOptions EngineSettings::model_options() const {
  ModelOptions o;
  o.batch_invariant = exact;
  o.n_gpu_layers = n_gpu_layers;
  return o;
}

EngineSettings EngineSettings::settle_exact(const Model& model) const {
  EngineSettings settled = *this;
  if (!exact || model.options().batch_invariant) return settled;
  if (model.exact_unavailable().empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "exact needs the model loaded with batch-invariant kernels "
                "(ModelOptions::batch_invariant, as model_options() gives): otherwise a matmul "
                "rounds a token differently when other tokens share its decode call");
  }
  settled.exact = false;
  return settled;
}

}  // namespace swarmkv
