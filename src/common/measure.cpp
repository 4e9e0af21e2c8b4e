#include "swarmkv/measure.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <string>

#include <sys/resource.h>
#include <unistd.h>

#include <fmt/format.h>

#include "swarmkv/error.h"

namespace swarmkv {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

long peak_rss_kib(pid_t pid) {
  std::ifstream in(pid == 0 ? std::string("/proc/self/status")
                            : "/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return 0;
}

AvailableMemory available_memory() {
  AvailableMemory best{UINT64_MAX, "unknown"};
  const auto consider = [&](uint64_t bytes, const char* limit) {
    if (bytes < best.bytes) best = {bytes, limit};
  };
  {
    std::ifstream in("/proc/meminfo");
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("MemAvailable:", 0) == 0) {
        consider(std::strtoull(line.c_str() + 13, nullptr, 10) * 1024, "MemAvailable");
      }
    }
  }
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    uint64_t pages = 0;
    std::ifstream("/proc/self/statm") >> pages;
    const uint64_t mapped = pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    consider(as.rlim_cur > mapped ? as.rlim_cur - mapped : 0,
             "the address-space limit (ulimit -v)");
  }
  {
    std::string max;
    uint64_t current = 0;
    std::ifstream("/sys/fs/cgroup/memory.max") >> max;
    std::ifstream("/sys/fs/cgroup/memory.current") >> current;
    if (!max.empty() && max != "max") {
      const uint64_t limit = std::strtoull(max.c_str(), nullptr, 10);
      consider(limit > current ? limit - current : 0, "the cgroup's memory.max");
    }
  }
  return best;
}

void require_memory(uint64_t bytes, std::string_view what, std::string_view parts,
                    std::string_view remedy) {
  const AvailableMemory available = available_memory();
  if (with_headroom(bytes) <= available.bytes) return;
  throw Error(ErrorCode::kBudget,
              fmt::format("not enough memory: {} needs about {:.2f} GiB ({}; with headroom "
                          "{:.2f} GiB) but {:.2f} GiB is available ({}); {}",
                          what, bytes / 1073741824.0, parts, with_headroom(bytes) / 1073741824.0,
                          available.bytes / 1073741824.0, available.limit, remedy));
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

}  // namespace swarmkv
