#include "swarmkv/graph.h"

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "swarmkv/error.h"

namespace swarmkv {

std::string_view to_string(NodeStatus status) noexcept {
  switch (status) {
    case NodeStatus::kOk:
      return "ok";
    case NodeStatus::kFailed:
      return "failed";
    case NodeStatus::kDependencyFailed:
      return "dependency_failed";
  }
  return "unknown";
}

void validate_graph(const std::vector<std::unique_ptr<Node>>& nodes) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!index.emplace(nodes[i]->name(), i).second) {
      throw Error(ErrorCode::kGraph, fmt::format("duplicate node name '{}'", nodes[i]->name()));
    }
  }
  for (const auto& node : nodes) {
    for (const std::string& dep : node->dependencies()) {
      if (!index.contains(dep)) {
        throw Error(ErrorCode::kGraph,
                    fmt::format("node '{}' depends on unknown node '{}'", node->name(), dep));
      }
    }
  }
  // Three-colour DFS, iterative so deep chains cannot overflow the stack.
  enum class Colour { kWhite, kGrey, kBlack };
  std::vector<Colour> colour(nodes.size(), Colour::kWhite);
  for (size_t root = 0; root < nodes.size(); ++root) {
    if (colour[root] != Colour::kWhite) continue;
    std::vector<std::pair<size_t, size_t>> stack{{root, 0}};  // (node, next dependency)
    colour[root] = Colour::kGrey;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      const auto& deps = nodes[node]->dependencies();
      if (next == deps.size()) {
        colour[node] = Colour::kBlack;
        stack.pop_back();
        continue;
      }
      const size_t dep = index.at(deps[next++]);
      if (colour[dep] == Colour::kGrey) {
        throw Error(ErrorCode::kGraph, fmt::format("cycle: edge '{} -> {}' closes a cycle",
                                                   nodes[node]->name(), nodes[dep]->name()));
      }
      if (colour[dep] == Colour::kWhite) {
        colour[dep] = Colour::kGrey;
        stack.emplace_back(dep, 0);
      }
    }
  }
}

std::vector<NodeOutcome> execute_graph(const std::vector<std::unique_ptr<Node>>& nodes,
                                       RunState& state) {
  validate_graph(nodes);
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) index.emplace(nodes[i]->name(), i);

  // Completion of every node. A node's outcome is written by its own thread
  // only, before it marks itself done under `mutex`; a dependent reads the
  // outcome only after seeing it done under `mutex`.
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<bool> done(nodes.size(), false);  // guarded by mutex
  std::vector<NodeOutcome> outcomes(nodes.size());
  const auto finish = [&](size_t i) {
    {
      std::lock_guard lock(mutex);
      done[i] = true;
    }
    changed.notify_all();
  };

  std::vector<std::future<void>> workers;
  workers.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    outcomes[i].name = nodes[i]->name();
    workers.push_back(std::async(std::launch::async, [&, i] {
      NodeOutcome& out = outcomes[i];
      Node& node = *nodes[i];
      for (const std::string& dep : node.dependencies()) {
        const size_t d = index.at(dep);
        {
          std::unique_lock lock(mutex);
          changed.wait(lock, [&] { return bool(done[d]); });
        }
        if (outcomes[d].status != NodeStatus::kOk) {
          out.status = NodeStatus::kDependencyFailed;
          out.error = ErrorValue{
              ErrorCode::kDependencyFailed,
              fmt::format("dependency '{}' failed: {}", dep, outcomes[d].error->to_string())};
          return finish(i);
        }
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        node.execute(state);
      } catch (...) {
        out.status = NodeStatus::kFailed;
        out.error = current_error_value();  // on this thread, before the exception is gone
      }
      out.elapsed_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      finish(i);
    }));
  }
  for (auto& w : workers) w.get();
  return outcomes;
}

}  // namespace swarmkv
