// The DAG: validation messages, the ready set's order and failure
// propagation, and the worker pool that runs a ready set.
#include "pipeline/dag.h"

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "swarmkv/error.h"

namespace swarmkv::detail {
namespace {

using Spec = std::vector<DagNode>;

std::string dag_error(const Spec& nodes) {
  try {
    resolve_dag(nodes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kGraph);
    return e.what();
  }
  return "no error";
}

ReadySet ready_set(const Spec& nodes) {
  std::vector<std::string> names;
  for (const DagNode& n : nodes) names.push_back(n.name);
  return ReadySet(std::move(names), resolve_dag(nodes));
}

// Runs `nodes` on `workers` threads; `work` per node name.
ReadySet run(const Spec& nodes, size_t workers,
             const std::function<void(const std::string&)>& work) {
  ReadySet ready = ready_set(nodes);
  run_on_workers(ready, workers, [&](size_t i) { work(nodes[i].name); });
  return ready;
}

TEST(DagTest, DuplicateNamesAreRejected) {
  EXPECT_EQ(dag_error({{"document", {}}, {"a", {"document"}}, {"a", {"document"}}}),
            "graph: duplicate node name 'a'");
}

TEST(DagTest, UnknownDependencyIsNamed) {
  EXPECT_EQ(dag_error({{"document", {}}, {"a", {"document", "ghost"}}}),
            "graph: node 'a' depends on unknown node 'ghost'");
}

TEST(DagTest, CycleErrorNamesTheClosingEdge) {
  EXPECT_EQ(dag_error({{"document", {}}, {"a", {"document", "b"}}, {"b", {"a"}}}),
            "graph: cycle: edge 'b -> a' closes a cycle");
  EXPECT_EQ(dag_error({{"self", {"self"}}}), "graph: cycle: edge 'self -> self' closes a cycle");
}

// Depth: the longest way down to a node without dependencies; an edge
// that closes a cycle counts as one to depth 0, and nothing recurses.
TEST(DagTest, DepthIsOneMoreThanTheDeepestDependency) {
  // 0 the root; 1, 2 on it; 3 on 1 and 2; 4 on 3 and 0; 5 alone.
  EXPECT_EQ(node_depths({{}, {0}, {0}, {1, 2}, {3, 0}, {}}), (std::vector<int>{0, 1, 1, 2, 3, 0}));
  // A cycle 1 -> 2 -> 1 under the root: the edge that closes it counts as 1.
  EXPECT_EQ(node_depths({{}, {0, 2}, {1}}), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(node_depths({{0}}), (std::vector<int>{1})) << "a node on itself";
  std::vector<std::vector<size_t>> chain(100000);
  for (size_t i = 1; i < chain.size(); ++i) chain[i] = {i - 1};
  EXPECT_EQ(node_depths(chain).back(), 99999);
}

// Ready nodes come out lowest first, and a node only once all of its
// dependencies have succeeded.
// Every pair of a small DAG against the answer by hand: along the spanning
// forest (the chain 0 <- 1 <- 2 <- 3) and across it (4 depends on 2 and 5;
// the forest reaches it through 2, so 5 is found by the search).
TEST(AncestryTest, AnswersAlongAndAcrossTheSpanningForest) {
  const std::vector<std::vector<size_t>> deps = {{}, {0}, {1}, {2}, {2, 5}, {0}};
  Ancestry ancestry(deps);
  const std::set<std::pair<size_t, size_t>> upstream = {
      {1, 0}, {2, 0}, {2, 1}, {3, 0}, {3, 1}, {3, 2}, {4, 0}, {4, 1}, {4, 2}, {4, 5}, {5, 0}};
  for (size_t node = 0; node < deps.size(); ++node) {
    for (size_t other = 0; other < deps.size(); ++other) {
      EXPECT_EQ(ancestry.depends_on(node, other), upstream.contains({node, other}))
          << node << " on " << other;
    }
  }
}

TEST(ReadySetTest, ReleasesDependentsInIndexOrderOnlyWhenAllDependenciesSucceeded) {
  ReadySet r =
      ready_set({{"document", {}}, {"a", {"document"}}, {"b", {"document"}}, {"c", {"b", "a"}}});
  EXPECT_EQ(r.pop(), 0u);
  EXPECT_EQ(r.pop(), std::nullopt) << "nothing may start before the document";
  r.succeed(0);
  EXPECT_EQ(r.pop(), 1u);
  EXPECT_EQ(r.pop(), 2u);
  EXPECT_EQ(r.running(), 2u);
  r.succeed(2);
  EXPECT_FALSE(r.has_ready()) << "c still waits for a";
  r.succeed(1);
  EXPECT_EQ(r.pop(), 3u);
  EXPECT_FALSE(r.finished());
  r.succeed(3);
  EXPECT_TRUE(r.finished());
  for (size_t i = 0; i < r.size(); ++i) EXPECT_EQ(r.status(i), NodeStatus::kOk);
}

// A failure decides every node downstream at once, with the chain of causes;
// independent nodes are untouched and can still run.
TEST(ReadySetTest, FailureDecidesEveryDependentAtOnceAndSparesIndependentNodes) {
  ReadySet r = ready_set({{"document", {}},
                          {"bad", {"document"}},
                          {"after_bad", {"bad"}},
                          {"after_after", {"after_bad", "document"}},
                          {"independent", {"document"}}});
  r.pop();
  r.succeed(0);
  EXPECT_EQ(r.pop(), 1u);
  r.fail(1, ErrorValue{ErrorCode::kState, "restored 10 of 20 bytes"});
  EXPECT_EQ(r.status(1), NodeStatus::kFailed);
  EXPECT_EQ(r.error(1), (ErrorValue{ErrorCode::kState, "restored 10 of 20 bytes"}));
  EXPECT_EQ(r.status(2), NodeStatus::kDependencyFailed);
  EXPECT_EQ(r.error(2), (ErrorValue{ErrorCode::kDependencyFailed,
                                    "dependency 'bad' failed: state: restored 10 of 20 bytes"}));
  EXPECT_EQ(r.status(3), NodeStatus::kDependencyFailed);
  EXPECT_EQ(r.error(3),
            (ErrorValue{ErrorCode::kDependencyFailed,
                        "dependency 'after_bad' failed: dependency_failed: dependency 'bad' "
                        "failed: state: restored 10 of 20 bytes"}));
  EXPECT_EQ(r.pop(), 4u) << "the independent node still runs";
  EXPECT_EQ(r.pop(), std::nullopt) << "no dependent of a failed node may run";
  r.succeed(4);
  EXPECT_TRUE(r.finished());
  EXPECT_EQ(r.error(4), std::nullopt);
}

TEST(ReadySetTest, EveryOutcomeIsReportedOnceWithItsStatusSet) {
  ReadySet r = ready_set(
      {{"document", {}}, {"bad", {"document"}}, {"after_bad", {"bad"}}, {"ok", {"document"}}});
  std::vector<std::pair<size_t, NodeStatus>> seen;
  r.set_on_decided([&](size_t node) { seen.emplace_back(node, r.status(node)); });
  r.pop();
  r.succeed(0);
  r.pop();
  r.fail(1, ErrorValue{ErrorCode::kState, "x"});
  r.pop();
  r.succeed(3);
  EXPECT_EQ(seen, (std::vector<std::pair<size_t, NodeStatus>>{{0, NodeStatus::kOk},
                                                              {1, NodeStatus::kFailed},
                                                              {2, NodeStatus::kDependencyFailed},
                                                              {3, NodeStatus::kOk}}));
}

TEST(ReadySetTest, OnlyARunningNodeCanBeDecided) {
  ReadySet r = ready_set({{"document", {}}, {"a", {"document"}}});
  EXPECT_THROW(r.succeed(1), Error);
  EXPECT_THROW(r.fail(0, ErrorValue{ErrorCode::kState, "x"}), Error);
}

TEST(WorkersTest, DiamondRunsEveryNodeOnceAfterItsDependencies) {
  std::mutex mutex;
  std::vector<std::string> order;
  const Spec nodes{{"document", {}}, {"a", {"document"}}, {"b", {"document"}}, {"c", {"a", "b"}}};
  const ReadySet r = run(nodes, 3, [&](const std::string& name) {
    std::lock_guard lock(mutex);
    order.push_back(name);
  });
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order.front(), "document");
  EXPECT_EQ(order.back(), "c");
  EXPECT_TRUE(r.finished());
}

// A fixed number of threads, whatever the number of nodes.
TEST(WorkersTest, SixtyFourNodesRunOnAtMostTheGivenNumberOfThreads) {
  Spec nodes{{"document", {}}};
  for (int i = 0; i < 64; ++i) nodes.push_back({"agent" + std::to_string(i), {"document"}});
  std::mutex mutex;
  std::set<std::thread::id> threads;
  std::atomic<int> runs{0};
  const ReadySet r = run(nodes, 3, [&](const std::string&) {
    ++runs;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(runs.load(), 65);
  EXPECT_LE(threads.size(), 3u);
  EXPECT_TRUE(r.finished());

  threads.clear();
  run(nodes, 1, [&](const std::string&) {
    std::lock_guard lock(mutex);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(threads, std::set<std::thread::id>{std::this_thread::get_id()})
      << "one worker is the calling thread";
}

// Many dependents of one failed node each get the cause as their own value,
// and nothing hangs.
TEST(WorkersTest, ManyDependentsOfAFailedNodeEachOwnTheCause) {
  const std::string cause(200, 'x');  // longer than any small-string buffer
  Spec nodes{{"document", {}}};
  for (int i = 0; i < 16; ++i) nodes.push_back({"agent" + std::to_string(i), {"document"}});
  std::atomic<int> runs{0};
  auto done = std::async(std::launch::async, [&] {
    return run(nodes, 2, [&](const std::string& name) {
      ++runs;
      if (name == "document") throw Error(ErrorCode::kInvalidBatch, cause);
    });
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "hung";
  const ReadySet r = done.get();
  EXPECT_EQ(r.error(0), (ErrorValue{ErrorCode::kInvalidBatch, cause}));
  for (size_t i = 1; i < r.size(); ++i) {
    EXPECT_EQ(r.error(i), (ErrorValue{ErrorCode::kDependencyFailed,
                                      "dependency 'document' failed: invalid_batch: " + cause}));
  }
  EXPECT_EQ(runs.load(), 1);
}

TEST(WorkersTest, AnythingThrownIsCaptured) {
  const ReadySet std_error = run({{"document", {}}, {"a", {"document"}}}, 2,
                                 [](const std::string&) { throw std::runtime_error("boom"); });
  EXPECT_EQ(std_error.error(0), (ErrorValue{ErrorCode::kInternal, "boom"}));
  EXPECT_EQ(std_error.error(1), (ErrorValue{ErrorCode::kDependencyFailed,
                                            "dependency 'document' failed: internal: boom"}));
  const ReadySet other = run({{"document", {}}}, 1, [](const std::string&) { throw 42; });
  EXPECT_EQ(other.status(0), NodeStatus::kFailed);
  EXPECT_EQ(other.error(0), (ErrorValue{ErrorCode::kInternal, "unknown exception"}));
}

}  // namespace
}  // namespace swarmkv::detail
