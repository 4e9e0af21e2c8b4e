#include "cluster/job_split.h"

#include <algorithm>
#include <numeric>

namespace swarmkv::cluster {

std::vector<std::vector<size_t>> split_by_cost(std::span<const size_t> agents,
                                               std::span<const int64_t> cost, size_t jobs) {
  const size_t n_jobs = std::min(std::max<size_t>(jobs, 1), agents.size());
  std::vector<size_t> by_cost(agents.size());  // positions in `agents`
  std::iota(by_cost.begin(), by_cost.end(), 0);
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [&](size_t a, size_t b) { return cost[agents[a]] > cost[agents[b]]; });
  std::vector<int64_t> load(n_jobs, 0);
  std::vector<std::vector<size_t>> positions(n_jobs);
  for (const size_t at : by_cost) {
    const size_t job =
        static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[job] += cost[agents[at]];
    positions[job].push_back(at);
  }
  std::vector<std::vector<size_t>> out(n_jobs);
  for (size_t j = 0; j < n_jobs; ++j) {
    std::sort(positions[j].begin(), positions[j].end());
    for (const size_t at : positions[j]) out[j].push_back(agents[at]);
  }
  return out;
}

}  // namespace swarmkv::cluster
