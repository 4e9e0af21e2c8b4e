// The engine settings on the command line: one set of flags for `run`,
// `prefill` and `bench`, each overriding the pipeline file's key of the
// same meaning (docs/engine-settings.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

#include "swarmkv/pipeline.h"

namespace swarmkv::cli {

struct EngineFlags {
  std::optional<uint32_t> n_batch;
  std::optional<uint32_t> n_ubatch;
  std::optional<int32_t> threads_batch;
  std::string flash_attn;  // "on" | "off" | "" (keep)
  std::string kv_type;     // "f16" | "q8_0" | "" (keep)
  std::optional<bool> exact;
  std::optional<int32_t> n_gpu_layers;

  // Adds -b/--n-batch, --n-ubatch, --threads-batch, --flash-attn, --kv-type,
  // --exact/--no-exact, --n-gpu-layers/--ngl.
  void add_to(CLI::App* app);
  // Sets the given flags in `spec`; validate_pipeline checks the result.
  void apply(PipelineSpec& spec) const;
};

// Throws Error(kInvalidArgument) for --flash-attn off while exact mode is
// on: exact runs on flash attention (`run`, `prefill`, `bench`, `serve`).
void require_flash_attn_for_exact(std::string_view flash_attn, bool exact);

// Adds --n-gpu-layers/--ngl (`run`, `prefill`, `bench`, `serve`, `worker`).
CLI::Option* add_n_gpu_layers(CLI::App* app, std::optional<int32_t>& n_gpu_layers);

}  // namespace swarmkv::cli
