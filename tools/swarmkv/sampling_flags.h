// The sampling settings on the command line: one flag per field of
// SamplingOptions, registered by walking for_each_sampling_field, so that a
// field added there cannot be left without its flag.
#pragma once

#include <CLI/CLI.hpp>

#include "swarmkv/engine.h"

namespace swarmkv::cli {

// Adds --temp, --top-p, --top-k, --seed, --repeat-penalty, --repeat-last-n,
// --frequency-penalty, --presence-penalty, --dry-multiplier, --dry-base,
// --dry-allowed-length, --dry-penalty-last-n and --top-logprobs to `app`, in
// that order, each bound to its field of `sampling` and showing its default
// (--temp checked against 0..100, --min-p 0..1 and --top-logprobs -1..20 by
// the parser; validate_sampling checks the rest after
// parsing). Throws Error(kInternal) for a field without a flag here.
void add_sampling_flags(CLI::App* app, SamplingOptions& sampling);

}  // namespace swarmkv::cli
