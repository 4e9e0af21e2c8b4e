// A DAG of named nodes and the executor that runs it.
//
// The executor knows names, edges and completion signals only, never node
// types: a node is anything that implements Node::execute.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "swarmkv/error.h"

namespace swarmkv {

// State shared by all nodes of one run; concrete runs derive from it.
class RunState {
 public:
  virtual ~RunState() = default;
};

// One unit of work in a graph. Implementations must be safe to execute on a
// thread of the executor's choosing, concurrently with other nodes.
class Node {
 public:
  Node(std::string name, std::vector<std::string> dependencies)
      : name_(std::move(name)), dependencies_(std::move(dependencies)) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& name() const noexcept { return name_; }
  const std::vector<std::string>& dependencies() const noexcept { return dependencies_; }

  // Runs the node once all its dependencies succeeded. Throws to fail; the
  // executor turns the exception into an ErrorValue on this node's thread.
  virtual void execute(RunState& state) = 0;

 private:
  std::string name_;
  std::vector<std::string> dependencies_;
};

// Checks the graph before anything runs. Throws Error(kGraph): "duplicate
// node name 'x'", "node 'a' depends on unknown node 'b'", or "cycle: edge
// 'a -> b' closes a cycle" (three-colour DFS; `a -> b` means a depends on b).
void validate_graph(const std::vector<std::unique_ptr<Node>>& nodes);

enum class NodeStatus { kOk, kFailed, kDependencyFailed };
std::string_view to_string(NodeStatus status) noexcept;

struct NodeOutcome {
  std::string name;
  NodeStatus status = NodeStatus::kOk;
  // Set unless kOk. kFailed: what the node threw (an Error keeps its code,
  // anything else is kInternal). kDependencyFailed: code kDependencyFailed,
  // message "dependency 'd' failed: <d's error as code: message>".
  std::optional<ErrorValue> error;
  double elapsed_ms = 0;
};

// Validates, then runs every node on its own thread, each gated on the
// completion of its dependencies. A failing node fails its dependents at once
// with its cause; independent nodes still finish. Errors pass between node
// threads as ErrorValues, never as exception objects. Returns one outcome per
// node, in the order given. Throws only what validate_graph throws.
// Thread-safe with respect to other calls.
std::vector<NodeOutcome> execute_graph(const std::vector<std::unique_ptr<Node>>& nodes,
                                       RunState& state);

}  // namespace swarmkv
