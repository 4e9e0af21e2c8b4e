#include "pipeline/dag.h"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include <fmt/format.h>

namespace swarmkv::detail {
namespace {

enum class Colour { kWhite, kGrey, kBlack };

// Walks `deps` depth first, iteratively (a deep chain cannot overflow the
// stack): `seen(node, dep, colour)` for an edge to a node already on the
// stack (grey: a cycle) or done (black); `done(node, parent)` once every
// dependency of `node` is done (parent: the node below it on the stack;
// none for a root).
template <class Seen, class Done>
void depth_first(const std::vector<std::vector<size_t>>& deps, Seen&& seen, Done&& done) {
  std::vector<Colour> colour(deps.size(), Colour::kWhite);
  for (size_t root = 0; root < deps.size(); ++root) {
    if (colour[root] != Colour::kWhite) continue;
    std::vector<std::pair<size_t, size_t>> stack{{root, 0}};  // (node, next dependency)
    colour[root] = Colour::kGrey;
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == deps[node].size()) {
        colour[node] = Colour::kBlack;
        const size_t finished = node;
        stack.pop_back();
        done(finished, stack.empty() ? std::nullopt : std::optional(stack.back().first));
        continue;
      }
      const size_t dep = deps[node][next++];
      if (colour[dep] == Colour::kWhite) {
        colour[dep] = Colour::kGrey;
        stack.emplace_back(dep, 0);
      } else {
        seen(node, dep, colour[dep]);
      }
    }
  }
}

}  // namespace

std::vector<std::vector<size_t>> resolve_dag(const std::vector<DagNode>& nodes) {
  std::unordered_map<std::string, size_t> index;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (!index.emplace(nodes[i].name, i).second) {
      throw Error(ErrorCode::kGraph, fmt::format("duplicate node name '{}'", nodes[i].name));
    }
  }
  std::vector<std::vector<size_t>> deps(nodes.size());
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (const std::string& dep : nodes[i].depends_on) {
      const auto it = index.find(dep);
      if (it == index.end()) {
        throw Error(ErrorCode::kGraph,
                    fmt::format("node '{}' depends on unknown node '{}'", nodes[i].name, dep));
      }
      deps[i].push_back(it->second);
    }
  }
  depth_first(
      deps,
      [&](size_t node, size_t dep, Colour colour) {
        if (colour == Colour::kGrey) {
          throw Error(ErrorCode::kGraph, fmt::format("cycle: edge '{} -> {}' closes a cycle",
                                                     nodes[node].name, nodes[dep].name));
        }
      },
      [](size_t, std::optional<size_t>) {});
  return deps;
}

std::vector<int> node_depths(const std::vector<std::vector<size_t>>& deps) {
  // A node's depth is settled when it is done; a grey dependency (a cycle)
  // counts as depth 0.
  std::vector<int> depth(deps.size(), 0);
  depth_first(
      deps,
      [&](size_t node, size_t dep, Colour colour) {
        depth[node] = std::max(depth[node], (colour == Colour::kBlack ? depth[dep] : 0) + 1);
      },
      [&](size_t node, std::optional<size_t> parent) {
        if (parent) depth[*parent] = std::max(depth[*parent], depth[node] + 1);
      });
  return depth;
}

ReadySet::ReadySet(std::vector<std::string> names, std::vector<std::vector<size_t>> dependencies,
                   std::vector<int32_t> priorities)
    : nodes_(names.size()), priorities_(std::move(priorities)) {
  if (dependencies.size() != names.size()) {
    throw Error(ErrorCode::kInternal, "ready set: one dependency list per node expected");
  }
  if (priorities_.empty()) priorities_.assign(names.size(), 0);
  if (priorities_.size() != names.size()) {
    throw Error(ErrorCode::kInternal, "ready set: one priority per node expected");
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    nodes_[i].name = std::move(names[i]);
    nodes_[i].missing = dependencies[i].size();
    for (const size_t d : dependencies[i]) nodes_.at(d).dependents.push_back(i);
  }
  for (size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].missing == 0) make_ready(i);
}

void ReadySet::make_ready(size_t node) {
  nodes_[node].state = State::kReady;
  nodes_[node].ready_at = Clock::now();
  ready_.push_back(node);
  std::push_heap(ready_.begin(), ready_.end(), [this](size_t a, size_t b) { return after(a, b); });
}

bool ReadySet::after(size_t a, size_t b) const {
  if (priorities_[a] != priorities_[b]) return priorities_[a] < priorities_[b];
  return a > b;
}

std::optional<size_t> ReadySet::pop() {
  if (ready_.empty()) return std::nullopt;
  std::pop_heap(ready_.begin(), ready_.end(), [this](size_t a, size_t b) { return after(a, b); });
  const size_t node = ready_.back();
  ready_.pop_back();
  nodes_[node].state = State::kRunning;
  ++running_;
  return node;
}

std::optional<size_t> ReadySet::pop_if(const std::function<bool(size_t)>& eligible) {
  std::optional<size_t> best;
  for (const size_t node : ready_) {
    if (eligible(node) && (!best || after(*best, node))) best = node;
  }
  if (!best) return std::nullopt;
  std::erase(ready_, *best);
  std::make_heap(ready_.begin(), ready_.end(), [this](size_t a, size_t b) { return after(a, b); });
  nodes_[*best].state = State::kRunning;
  ++running_;
  return best;
}

void ReadySet::decide(size_t node, NodeStatus status, std::optional<ErrorValue> error) {
  Entry& e = nodes_[node];
  e.state = State::kDone;
  e.status = status;
  e.error = std::move(error);
  ++decided_;
  if (on_decided_) on_decided_(node);
}

void ReadySet::succeed(size_t node) {
  if (nodes_.at(node).state != State::kRunning) {
    throw Error(ErrorCode::kInternal, fmt::format("ready set: '{}' is not running", node));
  }
  --running_;
  decide(node, NodeStatus::kOk, std::nullopt);
  for (const size_t d : nodes_[node].dependents) {
    if (--nodes_[d].missing == 0 && nodes_[d].state == State::kWaiting) make_ready(d);
  }
}

void ReadySet::fail(size_t node, ErrorValue error) {
  if (nodes_.at(node).state != State::kRunning) {
    throw Error(ErrorCode::kInternal, fmt::format("ready set: '{}' is not running", node));
  }
  --running_;
  decide(node, NodeStatus::kFailed, std::move(error));
  // Breadth-first over the dependents; a node waiting on a failed node can
  // be neither ready nor running, so each is decided here exactly once.
  std::vector<size_t> failed{node};
  for (size_t k = 0; k < failed.size(); ++k) {
    const size_t cause = failed[k];
    for (const size_t d : nodes_[cause].dependents) {
      if (nodes_[d].state != State::kWaiting) continue;
      decide(d, NodeStatus::kDependencyFailed,
             ErrorValue{ErrorCode::kDependencyFailed,
                        fmt::format("dependency '{}' failed: {}", nodes_[cause].name,
                                    nodes_[cause].error->to_string())});
      failed.push_back(d);
    }
  }
}

void run_on_workers(ReadySet& ready, size_t workers, const std::function<void(size_t)>& work) {
  std::mutex mutex;  // guards `ready`
  std::condition_variable changed;
  const auto worker = [&] {
    std::unique_lock lock(mutex);
    for (;;) {
      changed.wait(lock,
                   [&] { return ready.has_ready() || ready.finished() || ready.running() == 0; });
      const std::optional<size_t> node = ready.pop();
      if (!node) return;  // finished (a validated DAG never leaves nodes unreachable)
      lock.unlock();
      std::optional<ErrorValue> error;
      try {
        work(*node);
      } catch (...) {
        error = current_error_value();  // on this thread, before the exception is gone
      }
      lock.lock();
      if (error) {
        ready.fail(*node, std::move(*error));
      } else {
        ready.succeed(*node);
      }
      changed.notify_all();
    }
  };
  std::vector<std::thread> helpers;
  for (size_t i = 1; i < workers; ++i) helpers.emplace_back(worker);
  worker();
  for (auto& t : helpers) t.join();
}

Ancestry::Ancestry(const std::vector<std::vector<size_t>>& deps)
    : deps_(deps), enter_(deps.size(), 0), leave_(deps.size(), 0), seen_(deps.size(), 0) {
  std::vector<std::vector<size_t>> dependents(deps.size());
  for (size_t n = 0; n < deps.size(); ++n)
    for (const size_t d : deps[n]) dependents[d].push_back(n);
  // Iterative DFS from every root down the dependents: a node's forest
  // parent is the first dependency the walk reached it from. Clock 0 means
  // "not entered".
  size_t clock = 0;
  std::vector<std::pair<size_t, size_t>> stack;  // (node, next dependent)
  for (size_t root = 0; root < deps.size(); ++root) {
    if (!deps[root].empty() || enter_[root] != 0) continue;
    enter_[root] = ++clock;
    stack.emplace_back(root, 0);
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next == dependents[node].size()) {
        leave_[node] = ++clock;
        stack.pop_back();
        continue;
      }
      const size_t child = dependents[node][next++];
      if (enter_[child] != 0) continue;
      enter_[child] = ++clock;
      stack.emplace_back(child, 0);
    }
  }
}

bool Ancestry::depends_on(size_t node, size_t ancestor) {
  if (node == ancestor) return false;
  if (forest_ancestor(ancestor, node)) return true;
  ++query_;
  std::vector<size_t> todo = deps_.at(node);
  while (!todo.empty()) {
    const size_t d = todo.back();
    todo.pop_back();
    if (d == ancestor || forest_ancestor(ancestor, d)) return true;
    if (seen_[d] == query_) continue;
    seen_[d] = query_;
    todo.insert(todo.end(), deps_[d].begin(), deps_[d].end());
  }
  return false;
}

}  // namespace swarmkv::detail
