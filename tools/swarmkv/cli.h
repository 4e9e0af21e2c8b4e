// The swarmkv command line as a function, for main() and for the tests that
// drive it with generated arguments.
#pragma once

#include "swarmkv/error.h"

namespace swarmkv::cli {

// The exit status convention of every subcommand (README, `swarmkv --help`).
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;  // the run failed: an agent, the engine, an output
inline constexpr int kExitUsage = 2;   // refused before any work: arguments, input, budget
inline constexpr int kExitInterrupted = 130;

// kExitUsage for what a user fixes in the command or its input
// (invalid_argument, not_found, graph, budget, chat_template,
// incompatible, model_load), kExitInterrupted for aborted, kExitFailed otherwise.
int exit_code(ErrorCode code) noexcept;

// Parses `argv` and runs the subcommand; returns the exit status. Never
// throws: errors go to stderr (and, under --json, as
// {"ok": false, "error": {"code", "message"}} to stdout).
int run(int argc, char** argv);

}  // namespace swarmkv::cli
