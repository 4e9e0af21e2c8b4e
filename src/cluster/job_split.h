// How the coordinator cuts the agents it submits into jobs (pure; tested
// without Redis or a model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace swarmkv::cluster {

// `agents` (indexes) as at most `jobs` jobs of about equal cost, where
// `cost[i]` is agent i's (its prompt tokens + max_tokens: what a worker
// decodes for it). Costliest first, each agent joins the job with the least
// cost so far (ties: the earlier job); within a job the agents keep their
// order in `agents`. No job is empty; fewer agents than jobs make one job
// each.
std::vector<std::vector<size_t>> split_by_cost(std::span<const size_t> agents,
                                               std::span<const int64_t> cost, size_t jobs);

}  // namespace swarmkv::cluster
