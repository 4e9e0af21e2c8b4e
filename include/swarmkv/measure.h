// Measuring: one stopwatch, one median/percentile, one peak-RSS reader, for
// the library, the CLI and the benchmarks alike.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <sys/types.h>

namespace swarmkv {

using Clock = std::chrono::steady_clock;

inline double ms_between(Clock::time_point from, Clock::time_point to) noexcept {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Milliseconds since it was started (or restarted).
class Stopwatch {
 public:
  Stopwatch() noexcept : start_(Clock::now()) {}
  double ms() const noexcept { return ms_between(start_, Clock::now()); }
  Clock::time_point started() const noexcept { return start_; }
  void restart() noexcept { start_ = Clock::now(); }

 private:
  Clock::time_point start_;
};

// The p-th percentile (0 <= p <= 100) by linear interpolation between the
// closest ranks; 0 for an empty sample. median(v) == percentile(v, 50).
double percentile(std::vector<double> values, double p);
inline double median(std::vector<double> values) {
  return percentile(std::move(values), 50);
}

// Peak resident memory (VmHWM in /proc/<pid>/status) in KiB; pid 0 = this
// process. 0 when the process is gone or the field is missing.
long peak_rss_kib(pid_t pid = 0);
// Resets this process's VmHWM to its current RSS (writes "5" to
// /proc/self/clear_refs). False where the kernel refuses: peak_rss_kib() is
// then the peak since the process started.
bool reset_peak_rss();

// Memory this process can still allocate, the tightest of: MemAvailable
// (/proc/meminfo), the address-space limit (RLIMIT_AS, `ulimit -v`) less the
// address space already mapped, and the cgroup's memory.max less
// memory.current. `limit` names which one it is, e.g. "MemAvailable".
// bytes = UINT64_MAX, limit "unknown" when none can be read.
struct AvailableMemory {
  uint64_t bytes = 0;
  std::string limit;
};
AvailableMemory available_memory();

// What an estimate of `bytes` asks of available_memory(): 10 % and 256 MiB
// more, for what it does not count (thread stacks and malloc arenas, the
// host copy of a prefix, samplers, batches). Measured: a 300-agent shared
// run estimated at 1.99 GiB failed to create its context with 2.02 GiB of
// address space left (NOTES.md, "Memory is refused up front").
inline uint64_t with_headroom(uint64_t bytes) noexcept {
  return bytes + bytes / 10 + (uint64_t{256} << 20);
}

// The one refusal of an estimate that would not fit: throws Error(kBudget)
// "not enough memory: WHAT needs about X GiB (PARTS; with headroom H GiB)
// but Y GiB is available (LIMIT); REMEDY" when with_headroom(bytes) exceeds
// available_memory(); returns otherwise. check_memory (a pipeline run) and
// `swarmkv generate` call it before they allocate.
void require_memory(uint64_t bytes, std::string_view what, std::string_view parts,
                    std::string_view remedy);

}  // namespace swarmkv
