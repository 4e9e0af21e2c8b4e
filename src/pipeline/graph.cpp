#include "swarmkv/graph.h"

#include <chrono>
#include <exception>
#include <future>
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

  std::vector<std::promise<void>> done(nodes.size());
  std::vector<std::shared_future<void>> signals;
  signals.reserve(nodes.size());
  for (auto& p : done) signals.push_back(p.get_future().share());

  std::vector<NodeOutcome> outcomes(nodes.size());
  std::vector<std::future<void>> workers;
  workers.reserve(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    outcomes[i].name = nodes[i]->name();
    workers.push_back(std::async(std::launch::async, [&, i] {
      NodeOutcome& out = outcomes[i];
      Node& node = *nodes[i];
      for (const std::string& dep : node.dependencies()) {
        try {
          signals[index.at(dep)].get();
        } catch (const std::exception& e) {
          out.status = NodeStatus::kDependencyFailed;
          out.error = fmt::format("dependency '{}' failed: {}", dep, e.what());
          done[i].set_exception(
              std::make_exception_ptr(Error(ErrorCode::kDependencyFailed, out.error)));
          return;
        }
      }
      const auto start = std::chrono::steady_clock::now();
      try {
        node.execute(state);
        out.elapsed_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        done[i].set_value();
      } catch (const std::exception& e) {
        out.elapsed_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                .count();
        out.status = NodeStatus::kFailed;
        out.error = e.what();
        done[i].set_exception(std::current_exception());
      } catch (...) {
        out.status = NodeStatus::kFailed;
        out.error = "unknown exception";
        done[i].set_exception(std::current_exception());
      }
    }));
  }
  for (auto& w : workers) w.get();
  return outcomes;
}

}  // namespace swarmkv
