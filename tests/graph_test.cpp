#include "swarmkv/graph.h"

#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "swarmkv/error.h"

namespace swarmkv {
namespace {

struct CountingState : RunState {
  std::atomic<int> runs{0};
};

class FnNode final : public Node {
 public:
  FnNode(std::string name, std::vector<std::string> deps,
         std::function<void(CountingState&)> fn = {})
      : Node(std::move(name), std::move(deps)), fn_(std::move(fn)) {}
  void execute(RunState& state) override {
    auto& s = static_cast<CountingState&>(state);
    s.runs.fetch_add(1);
    if (fn_) fn_(s);
  }

 private:
  std::function<void(CountingState&)> fn_;
};

using Nodes = std::vector<std::unique_ptr<Node>>;

Nodes make(std::initializer_list<std::pair<const char*, std::vector<std::string>>> spec) {
  Nodes nodes;
  for (const auto& [name, deps] : spec) nodes.push_back(std::make_unique<FnNode>(name, deps));
  return nodes;
}

std::string graph_error(const Nodes& nodes) {
  try {
    validate_graph(nodes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kGraph);
    return e.what();
  }
  return "no error";
}

TEST(GraphTest, DuplicateNamesAreRejected) {
  EXPECT_EQ(graph_error(make({{"document", {}}, {"a", {"document"}}, {"a", {"document"}}})),
            "graph: duplicate node name 'a'");
}

TEST(GraphTest, UnknownDependencyIsNamed) {
  EXPECT_EQ(graph_error(make({{"document", {}}, {"a", {"document", "ghost"}}})),
            "graph: node 'a' depends on unknown node 'ghost'");
}

TEST(GraphTest, CycleErrorNamesTheClosingEdge) {
  EXPECT_EQ(graph_error(make({{"document", {}}, {"a", {"document", "b"}}, {"b", {"a"}}})),
            "graph: cycle: edge 'b -> a' closes a cycle");
  EXPECT_EQ(graph_error(make({{"self", {"self"}}})),
            "graph: cycle: edge 'self -> self' closes a cycle");
}

TEST(GraphTest, DiamondIsValidAndEveryNodeRunsOnce) {
  Nodes nodes =
      make({{"document", {}}, {"a", {"document"}}, {"b", {"document"}}, {"c", {"a", "b"}}});
  CountingState state;
  const auto outcomes = execute_graph(nodes, state);
  EXPECT_EQ(state.runs.load(), 4);
  for (const auto& o : outcomes) EXPECT_EQ(o.status, NodeStatus::kOk) << o.name;
}

TEST(GraphTest, DependentsRunAfterTheirDependencies) {
  std::atomic<bool> root_done{false};
  Nodes nodes;
  nodes.push_back(
      std::make_unique<FnNode>("document", std::vector<std::string>{}, [&](CountingState&) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        root_done = true;
      }));
  std::atomic<int> saw_root{0};
  for (int i = 0; i < 16; ++i) {
    nodes.push_back(
        std::make_unique<FnNode>("branch" + std::to_string(i), std::vector<std::string>{"document"},
                                 [&](CountingState&) { saw_root += root_done ? 1 : 0; }));
  }
  CountingState state;
  execute_graph(nodes, state);
  EXPECT_EQ(saw_root.load(), 16);
}

// A failing node fails its dependents at once, with its cause; independent
// nodes still complete; nothing hangs.
TEST(GraphTest, FailureReachesDependentsFastAndSparesIndependentNodes) {
  Nodes nodes;
  nodes.push_back(std::make_unique<FnNode>("document", std::vector<std::string>{}));
  nodes.push_back(std::make_unique<FnNode>(
      "bad", std::vector<std::string>{"document"},
      [](CountingState&) { throw Error(ErrorCode::kState, "restored 10 of 20 bytes"); }));
  nodes.push_back(std::make_unique<FnNode>("after_bad", std::vector<std::string>{"bad"}));
  nodes.push_back(std::make_unique<FnNode>("after_after", std::vector<std::string>{"after_bad"}));
  nodes.push_back(std::make_unique<FnNode>(
      "independent", std::vector<std::string>{"document"},
      [](CountingState&) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }));
  CountingState state;
  auto run = std::async(std::launch::async, [&] { return execute_graph(nodes, state); });
  ASSERT_EQ(run.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the executor hung";
  const auto outcomes = run.get();
  ASSERT_EQ(outcomes.size(), 5u);
  EXPECT_EQ(outcomes[0].error, std::nullopt);
  EXPECT_EQ(outcomes[1].status, NodeStatus::kFailed);
  EXPECT_EQ(outcomes[1].error, (ErrorValue{ErrorCode::kState, "restored 10 of 20 bytes"}));
  EXPECT_EQ(outcomes[2].status, NodeStatus::kDependencyFailed);
  EXPECT_EQ(outcomes[2].error,
            (ErrorValue{ErrorCode::kDependencyFailed,
                        "dependency 'bad' failed: state: restored 10 of 20 bytes"}));
  EXPECT_EQ(outcomes[3].status, NodeStatus::kDependencyFailed);
  EXPECT_EQ(outcomes[3].error,
            (ErrorValue{ErrorCode::kDependencyFailed,
                        "dependency 'after_bad' failed: dependency_failed: dependency 'bad' "
                        "failed: state: restored 10 of 20 bytes"}));
  EXPECT_EQ(outcomes[4].status, NodeStatus::kOk);
  EXPECT_EQ(outcomes[4].error, std::nullopt);
  EXPECT_EQ(state.runs.load(), 3) << "dependents of a failed node must not run";
}

// Many dependents of one failed node each get the cause as their own value,
// while the failing node's exception is long gone. Under TSan this is the
// shape that used to report (see NOTES.md, "Errors cross threads as values").
TEST(GraphTest, ManyDependentsOfAFailedNodeEachOwnTheCause) {
  const std::string cause(200, 'x');  // longer than any small-string buffer
  Nodes nodes;
  nodes.push_back(std::make_unique<FnNode>(
      "document", std::vector<std::string>{},
      [&](CountingState&) { throw Error(ErrorCode::kInvalidBatch, cause); }));
  for (int i = 0; i < 16; ++i) {
    nodes.push_back(std::make_unique<FnNode>("agent" + std::to_string(i),
                                             std::vector<std::string>{"document"}));
  }
  CountingState state;
  const auto outcomes = execute_graph(nodes, state);
  EXPECT_EQ(outcomes[0].error, (ErrorValue{ErrorCode::kInvalidBatch, cause}));
  for (size_t i = 1; i < outcomes.size(); ++i) {
    EXPECT_EQ(outcomes[i].status, NodeStatus::kDependencyFailed) << outcomes[i].name;
    EXPECT_EQ(outcomes[i].error,
              (ErrorValue{ErrorCode::kDependencyFailed,
                          "dependency 'document' failed: invalid_batch: " + cause}));
  }
  EXPECT_EQ(state.runs.load(), 1);
}

TEST(GraphTest, NonStandardExceptionsAreCaptured) {
  Nodes nodes;
  nodes.push_back(
      std::make_unique<FnNode>("document", std::vector<std::string>{},
                               [](CountingState&) { throw std::runtime_error("boom"); }));
  nodes.push_back(std::make_unique<FnNode>("a", std::vector<std::string>{"document"}));
  CountingState state;
  const auto outcomes = execute_graph(nodes, state);
  EXPECT_EQ(outcomes[0].error, (ErrorValue{ErrorCode::kInternal, "boom"}));
  EXPECT_EQ(outcomes[1].error, (ErrorValue{ErrorCode::kDependencyFailed,
                                           "dependency 'document' failed: internal: boom"}));
}

TEST(GraphTest, AnythingThrownIsCaptured) {
  Nodes nodes;
  nodes.push_back(std::make_unique<FnNode>("document", std::vector<std::string>{},
                                           [](CountingState&) { throw 42; }));
  CountingState state;
  const auto outcomes = execute_graph(nodes, state);
  EXPECT_EQ(outcomes[0].status, NodeStatus::kFailed);
  EXPECT_EQ(outcomes[0].error, (ErrorValue{ErrorCode::kInternal, "unknown exception"}));
}

}  // namespace
}  // namespace swarmkv
