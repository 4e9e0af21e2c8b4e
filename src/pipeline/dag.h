// The pipeline's DAG and the one place that knows its dependencies: a ready
// set with in-degree counts. Every fork strategy drives one: it takes ready
// nodes, runs them on threads of its own choosing, and reports each outcome.
// Node 0 is the document; node i > 0 is agent i - 1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::detail {

struct DagNode {
  std::string name;
  std::vector<std::string> depends_on;
};

// Checks names and edges, then returns each node's dependencies as indices.
// Throws Error(kGraph): "duplicate node name 'x'", "node 'a' depends on
// unknown node 'b'", or "cycle: edge 'a -> b' closes a cycle" (three-colour
// DFS; `a -> b` means a depends on b).
std::vector<std::vector<size_t>> resolve_dag(const std::vector<DagNode>& nodes);

// Each node's depth: 0 for a node without dependencies, else one more than
// its deepest dependency (`deps` as resolve_dag returns them). It also takes
// a graph resolve_dag would refuse (a drawn result, hand-edited): an edge
// that closes a cycle counts as one to a node of depth 0. O(n + e), no
// recursion.
std::vector<int> node_depths(const std::vector<std::vector<size_t>>& deps);

// Answers "does `node` depend on `ancestor`, directly or not" over the
// result of resolve_dag (`deps`, which must outlive it). Built in O(n + e):
// interval labels on a spanning forest of the graph answer in O(1) for an
// ancestor along the forest (every one when each node has at most one
// dependency besides a common root, as in a chain); otherwise a search up
// the dependencies that stops where the labels or the ancestor are met.
// Thread-compatible (a query uses scratch space).
class Ancestry {
 public:
  explicit Ancestry(const std::vector<std::vector<size_t>>& deps);
  bool depends_on(size_t node, size_t ancestor);

 private:
  // `ancestor` is above `node` in the spanning forest.
  bool forest_ancestor(size_t ancestor, size_t node) const {
    return enter_[ancestor] < enter_[node] && leave_[node] <= leave_[ancestor];
  }
  const std::vector<std::vector<size_t>>& deps_;
  std::vector<size_t> enter_, leave_;  // DFS clock over the forest of dependents
  std::vector<size_t> seen_;           // the query that last visited each node
  size_t query_ = 0;
};

// The nodes of a validated DAG with their state. Not thread-safe: the caller
// serialises access (one scheduler thread, or its own mutex).
class ReadySet {
 public:
  // `priorities`: one per node, or empty for all 0.
  ReadySet(std::vector<std::string> names, std::vector<std::vector<size_t>> dependencies,
           std::vector<int32_t> priorities = {});

  // The ready node (dependencies all succeeded, not handed out yet) of the
  // highest priority, the lowest-numbered among equals; it is then running.
  // nullopt when none is ready.
  std::optional<size_t> pop();
  // The same among the ready nodes `eligible` accepts.
  std::optional<size_t> pop_if(const std::function<bool(size_t)>& eligible);
  bool has_ready() const noexcept { return !ready_.empty(); }

  // Records a running node's outcome. succeed() makes dependents whose last
  // dependency this was ready; fail() fails every node that depends on it,
  // directly or not, at once with kDependencyFailed: "dependency 'd' failed:
  // <d's error as code: message>" (d: the node's own failed dependency).
  void succeed(size_t node);
  void fail(size_t node, ErrorValue error);

  // Called as each node gets its outcome, from succeed() or fail() (for
  // the dependents fail() decides too), with status() and error() already
  // set; it must not call back into this set.
  void set_on_decided(std::function<void(size_t node)> on_decided) {
    on_decided_ = std::move(on_decided);
  }

  size_t size() const noexcept { return nodes_.size(); }
  // Handed out (running) or decided.
  bool started(size_t node) const {
    return nodes_.at(node).state == State::kRunning || nodes_.at(node).state == State::kDone;
  }
  size_t running() const noexcept { return running_; }
  // Every node has an outcome.
  bool finished() const noexcept { return decided_ == nodes_.size(); }
  NodeStatus status(size_t node) const { return nodes_.at(node).status; }
  const std::optional<ErrorValue>& error(size_t node) const { return nodes_.at(node).error; }
  // When the node became ready. Fixed once the node was popped: a worker may
  // read its own node's value without the caller's lock.
  Clock::time_point ready_at(size_t node) const { return nodes_.at(node).ready_at; }

 private:
  enum class State : std::uint8_t { kWaiting, kReady, kRunning, kDone };
  struct Entry {
    std::string name;
    std::vector<size_t> dependents;
    size_t missing = 0;  // dependencies that have not succeeded yet
    State state = State::kWaiting;
    NodeStatus status = NodeStatus::kOk;
    std::optional<ErrorValue> error;
    Clock::time_point ready_at;
  };
  void make_ready(size_t node);
  void decide(size_t node, NodeStatus status, std::optional<ErrorValue> error);

  // Whether `a` is popped after `b`: the heap's order.
  bool after(size_t a, size_t b) const;

  std::vector<Entry> nodes_;
  std::vector<int32_t> priorities_;  // one per node
  std::vector<size_t> ready_;        // a heap by after()
  size_t running_ = 0;
  size_t decided_ = 0;
  std::function<void(size_t)> on_decided_;
};

// Runs every node of `ready` on `workers` threads (the calling thread is one
// of them; 1 = the calling thread alone), lowest ready node first. `work`
// throws to fail its node; the exception becomes an ErrorValue on the thread
// that caught it. Returns when every node has an outcome.
void run_on_workers(ReadySet& ready, size_t workers, const std::function<void(size_t)>& work);

}  // namespace swarmkv::detail
