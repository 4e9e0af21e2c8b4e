// The CLI's prefill progress line.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <functional>
#include <iostream>

#include <fmt/format.h>

namespace swarmkv::cli {

// "prefill: done/total tokens (p%)" redrawn on stderr when it is a terminal;
// an empty function otherwise (logs and CI stay clean).
inline std::function<void(size_t, size_t)> prefill_progress() {
  if (::isatty(STDERR_FILENO) != 1) return {};
  return [](size_t done, size_t total) {
    std::cerr << fmt::format("\rprefill: {}/{} tokens ({:.0f}%)", done, total,
                             100.0 * static_cast<double>(done) / static_cast<double>(total))
              << (done == total ? "\n" : "") << std::flush;
  };
}

}  // namespace swarmkv::cli
