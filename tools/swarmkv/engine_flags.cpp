#include "engine_flags.h"

namespace swarmkv::cli {

void EngineFlags::add_to(CLI::App* app) {
  app->add_option("-b,--n-batch", n_batch,
                  "most tokens per llama_decode call, the prefill's chunk (file key n_batch; "
                  "default 512)")
      ->check(CLI::Range(1u, 65536u));
  app->add_option("--n-ubatch", n_ubatch,
                  "the prefill's micro-batch, a divisor of n_batch (file key n_ubatch; 0 = "
                  "automatic: 256 when it divides n_batch, else n_batch)");
  app->add_option("--threads-batch", threads_batch,
                  "threads for the prefill and batched steps (file key threads_batch; 0 = "
                  "--threads)");
  app->add_option("--flash-attn", flash_attn,
                  "flash attention (file key flash_attn): on whenever exact mode is (the "
                  "default), whatever the file says; with --no-exact default off (on makes the "
                  "prefill 1.2-1.4x faster and the agents' decoding 2.2-4x slower here, "
                  "docs/engine-settings.md). "
                  "off needs --no-exact")
      ->check(CLI::IsMember({"on", "off"}));
  app->add_option("--kv-type", kv_type,
                  "K and V cache type (file key kv_type; default q8_0 where flash attention "
                  "runs, as exact mode has it, else f16). q8_0 halves the KV memory and every "
                  "snapshot; on the exact kernels a run takes what f16's takes on SmolLM2 and up "
                  "to a tenth longer on Gemma 3, on llama.cpp's stock ones (--no-exact "
                  "--flash-attn on) it prefills at a third to a half of f16's speed; it needs "
                  "flash attention (docs/engine-settings.md)")
      ->check(CLI::IsMember({"f16", "q8_0"}));
  app->add_flag_function(
      "--exact,!--no-exact", [this](int64_t count) { exact = count > 0; },
      "exact mode (file key exact; default on): batch-invariant decoding, so that every "
      "answer equals --fork none's, a re-prefill's, token for token under every fork strategy "
      "and with needs: flash attention through our batch-invariant kernel, no cell reused while "
      "agents run, batch-invariant matmuls, of the repacked weight layouts only Q4_0's and "
      "IQ4_NL's (our llama.cpp patches; a "
      "llama.cpp without them, or layers on a GPU, runs without, says why once and reports "
      "exact false). --no-exact: llama.cpp's stock kernels, whose rounding depends on the "
      "other tokens of a decode call (docs/exact-mode.md)");
  add_n_gpu_layers(app, n_gpu_layers);
}

CLI::Option* add_n_gpu_layers(CLI::App* app, std::optional<int32_t>& n_gpu_layers) {
  return app
      ->add_option("--n-gpu-layers,--ngl", n_gpu_layers,
                   "layers on the GPU of a GPU build of llama.cpp (file key n_gpu_layers; "
                   "default 0: CPU only; -1 or the layer count + 1: all, the output layer "
                   "counted as llama.cpp does). Exact mode is CPU-only: a run with layers on a "
                   "GPU is not exact and says so. A build without a GPU backend warns and runs "
                   "on the CPU (SWARMKV_CUDA=1 builds one, docs/engine-settings.md)")
      ->check(CLI::Range(-1, 1 << 16));
}

void EngineFlags::apply(PipelineSpec& spec) const {
  if (n_batch) spec.n_batch = *n_batch;
  if (n_ubatch) spec.n_ubatch = *n_ubatch;
  if (threads_batch) spec.n_threads_batch = *threads_batch;
  if (!flash_attn.empty()) spec.flash_attn = flash_attn == "on";
  if (!kv_type.empty()) spec.kv_type = parse_kv_type(kv_type);
  if (exact) spec.exact = *exact;
  if (n_gpu_layers) spec.n_gpu_layers = *n_gpu_layers;
  require_flash_attn_for_exact(flash_attn, spec.exact);
}

void require_flash_attn_for_exact(std::string_view flash_attn, bool exact) {
  if (flash_attn == "off" && exact) {
    throw Error(ErrorCode::kInvalidArgument,
                "--flash-attn off: exact mode (the default) runs on flash attention; add "
                "--no-exact for llama.cpp's kernels without it");
  }
}

}  // namespace swarmkv::cli
