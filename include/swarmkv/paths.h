// Where SwarmKV finds its default model and caches.
#pragma once

#include <string>
#include <string_view>

namespace swarmkv {

// File name of the default model (SmolLM2-135M-Instruct, Q4_1).
inline constexpr std::string_view kDefaultModelFile = "SmolLM2-135M-Instruct.Q4_1.gguf";

// The cache root: $SWARMKV_CACHE, else $XDG_CACHE_HOME/swarmkv, else
// $HOME/.cache/swarmkv (the same rule as scripts/lib.sh).
std::string cache_dir();

// The model to use: `explicit_path` when non-empty, else $SWARMKV_MODEL when
// set, else <cache_dir()>/models/<kDefaultModelFile>. Throws Error(kNotFound)
// naming every place it looked and how to fetch the default model.
std::string resolve_model_path(std::string_view explicit_path);

// The whole content of a file. Throws Error(kNotFound) when it cannot be
// opened, Error(kIo) when reading fails.
std::string read_file(const std::string& path);

}  // namespace swarmkv
