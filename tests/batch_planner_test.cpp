// The shared fork's planner, driven without a model: a fake engine "decodes"
// each plan and answers every agent after a scripted number of tokens.
#include "pipeline/batch_planner.h"

#include <algorithm>
#include <map>
#include <string>

#include <fmt/format.h>

#include <gtest/gtest.h>

namespace swarmkv::detail {
namespace {

// The DAG of a pipeline: node 0 the document (already succeeded), node a + 1
// agent a, which depends on the document and on `deps[a]`.
ReadySet pipeline_dag(const std::vector<std::vector<size_t>>& deps) {
  std::vector<std::string> names{"document"};
  std::vector<std::vector<size_t>> edges{{}};
  for (size_t a = 0; a < deps.size(); ++a) {
    names.push_back("agent" + std::to_string(a));
    edges.push_back({0});
    for (const size_t d : deps[a]) edges.back().push_back(d + 1);
  }
  ReadySet dag(std::move(names), std::move(edges));
  dag.pop();
  dag.succeed(0);
  return dag;
}

// One plan, written compactly: "a0:p0-4 a1:p0-2" = agent 0's prompt tokens
// 0..4, then agent 1's 0..2; "a0:g@12" = agent 0's generated token at
// position 12; a trailing "*" marks the token whose logits are sampled.
std::string describe(const BatchPlan& plan) {
  std::string out;
  for (size_t i = 0; i < plan.tokens.size(); ++i) {
    const PlannedToken& t = plan.tokens[i];
    const bool run_continues = i + 1 < plan.tokens.size() && plan.tokens[i + 1].agent == t.agent &&
                               plan.tokens[i + 1].prompt_index == t.prompt_index + 1 &&
                               t.prompt_index >= 0;
    const bool run_starts = i == 0 || plan.tokens[i - 1].agent != t.agent || t.prompt_index < 0 ||
                            plan.tokens[i - 1].prompt_index < 0;
    if (t.document) {
      const bool first = i == 0 || !plan.tokens[i - 1].document;
      const bool last = i + 1 == plan.tokens.size() || !plan.tokens[i + 1].document;
      if (first) out += fmt::format("{}d{}", out.empty() ? "" : " ", t.pos);
      if (last) out += fmt::format("-{}", t.pos);
      continue;
    }
    if (t.prompt_index < 0) {
      out +=
          fmt::format("{}a{}:g@{}{}", out.empty() ? "" : " ", t.agent, t.pos, t.logits ? "*" : "");
      continue;
    }
    if (run_starts)
      out += fmt::format("{}a{}:p{}", out.empty() ? "" : " ", t.agent, t.prompt_index);
    if (!run_continues) {
      out += fmt::format("-{}{}", t.prompt_index, t.logits ? "*" : "");
    }
  }
  return out;
}

// The fake engine: each agent answers after `answer_tokens[a]` sampled
// tokens. Returns every plan and admission, in order.
std::vector<std::string> drive(BatchPlanner& planner, const std::vector<int>& answer_tokens) {
  std::vector<std::string> log;
  std::map<size_t, int> sampled;
  for (int guard = 0; !planner.finished() && guard < 1000; ++guard) {
    for (const auto& a : planner.admit())
      log.push_back(fmt::format("admit a{} seq {}", a.agent, a.seq));
    const BatchPlan plan = planner.next();
    if (plan.tokens.empty()) continue;
    log.push_back(describe(plan));
    planner.decoded(plan);
    for (const PlannedToken& t : plan.tokens) {
      if (!t.logits) continue;
      planner.sampled(t.agent, ++sampled[t.agent] == answer_tokens[t.agent]);
    }
  }
  return log;
}

TEST(BatchPlannerTest, AdmitsLowestAgentFirstAsSequenceIdsFreeUp) {
  ReadySet dag = pipeline_dag({{}, {}, {}, {}});
  // Two branch sequence ids (n_seq_max 3): agents 2 and 3 wait for a free one.
  BatchPlanner planner(dag, {2, 2, 2, 2}, 100, 3, 16);
  const std::vector<std::string> log = drive(planner, {1, 2, 1, 1});
  const std::vector<std::string> want = {
      "admit a0 seq 1",     "admit a1 seq 2",
      "a0:p0-1* a1:p0-1*",               // a0 answers with its first token and frees sequence 1
      "admit a2 seq 1",                  // the lowest waiting agent takes it
      "a1:g@102* a2:p0-1*",              // generated tokens first, then the new prompt
      "admit a3 seq 1",     "a3:p0-1*",  // ids are reused last freed first
  };
  EXPECT_EQ(log, want);
  EXPECT_TRUE(dag.finished());
}

TEST(BatchPlannerTest, PromptsOverflowingNBatchContinueInTheNextStep) {
  ReadySet dag = pipeline_dag({{}, {}});
  BatchPlanner planner(dag, {5, 7}, 40, 3, 8);
  const std::vector<std::string> log = drive(planner, {3, 1});
  const std::vector<std::string> want = {
      "admit a0 seq 1",    "admit a1 seq 2",
      "a0:p0-4* a1:p0-2",   // 8 tokens: a1's prompt is cut at n_batch
      "a0:g@45* a1:p3-6*",  // a generating branch always gets its one token
      "a0:g@46*",
  };
  EXPECT_EQ(log, want);
  for (const std::string& step : log) {
    EXPECT_EQ(step.find("a1:p3-2"), std::string::npos) << "a prompt token planned twice";
  }
}

TEST(BatchPlannerTest, NoPlanExceedsNBatchAndEveryPromptTokenIsPlannedOnce) {
  ReadySet dag = pipeline_dag({{}, {}, {}, {}, {}, {}});
  const std::vector<int32_t> prompts{9, 1, 13, 4, 30, 2};
  BatchPlanner planner(dag, prompts, 7, 4, 6);
  std::map<size_t, std::vector<Pos>> prompt_positions;
  std::map<size_t, int> sampled;
  const std::vector<int> answer{3, 1, 2, 5, 1, 4};
  while (!planner.finished()) {
    planner.admit();
    const BatchPlan plan = planner.next();
    ASSERT_LE(plan.tokens.size(), 6u);
    ASSERT_FALSE(plan.tokens.empty());
    EXPECT_EQ(plan.step.prompt_tokens + plan.step.generate_tokens,
              static_cast<int32_t>(plan.tokens.size()));
    planner.decoded(plan);
    for (const PlannedToken& t : plan.tokens) {
      if (t.prompt_index >= 0) prompt_positions[t.agent].push_back(t.pos);
      if (t.logits) planner.sampled(t.agent, ++sampled[t.agent] == answer[t.agent]);
    }
  }
  for (size_t a = 0; a < prompts.size(); ++a) {
    std::vector<Pos> want(static_cast<size_t>(prompts[a]));
    for (size_t i = 0; i < want.size(); ++i) want[i] = 7 + static_cast<Pos>(i);
    EXPECT_EQ(prompt_positions[a], want) << "agent " << a;
    EXPECT_EQ(sampled[a], answer[a]) << "agent " << a;
  }
  EXPECT_EQ(planner.cells(), 0) << "every finished branch frees its cells";
  EXPECT_GT(planner.peak_cells(), 0);
}

TEST(BatchPlannerTest, ADependentIsAdmittedOnlyAfterItsDependencyAnswered) {
  ReadySet dag = pipeline_dag({{}, {0}, {}});  // agent 1 waits for agent 0
  BatchPlanner planner(dag, {2, 2, 2}, 10, 8, 16);
  const std::vector<std::string> log = drive(planner, {2, 1, 1});
  const std::vector<std::string> want = {
      "admit a0 seq 1", "admit a2 seq 2", "a0:p0-1* a2:p0-1*",
      "a0:g@12*",  // a2 answered; a1 still waits for a0
      "admit a1 seq 1", "a1:p0-1*",
  };
  EXPECT_EQ(log, want);
}

TEST(BatchPlannerTest, AFailedBranchFreesItsIdAndFailsItsDependents) {
  ReadySet dag = pipeline_dag({{}, {0}, {}});
  BatchPlanner planner(dag, {2, 2, 2}, 10, 2, 16);  // one branch id
  ASSERT_EQ(planner.admit().size(), 1u);
  const BatchPlan plan = planner.next();
  planner.decoded(plan);
  planner.fail(0, ErrorValue{ErrorCode::kInvalidBatch, "bad positions"});
  EXPECT_EQ(dag.status(2), NodeStatus::kDependencyFailed);
  EXPECT_EQ(dag.error(2)->message, "dependency 'agent0' failed: invalid_batch: bad positions");
  EXPECT_EQ(planner.cells(), 0);
  const auto next = planner.admit();
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].agent, 2u);
  EXPECT_EQ(next[0].seq, 1) << "the failed branch's id is free again";
}

TEST(BatchPlannerTest, MaxLiveCapsTheLiveBranchesAndPriorityOrdersAdmission) {
  // Five agents, priorities 0, 0, 2, 1, 2; room for four branches, max_live 2.
  ReadySet dag({"document", "agent0", "agent1", "agent2", "agent3", "agent4"},
               {{}, {0}, {0}, {0}, {0}, {0}}, {0, 0, 0, 2, 1, 2});
  dag.pop();
  dag.succeed(0);
  BatchPlanner planner(dag, {1, 1, 1, 1, 1}, 10, 5, 16, /*max_live=*/2);
  const std::vector<std::string> log = drive(planner, {1, 1, 1, 3, 1});
  const std::vector<std::string> want = {
      "admit a2 seq 1", "admit a4 seq 2",    "a2:p0-0* a4:p0-0*",  // priority 2, file order
      "admit a3 seq 2", "admit a0 seq 1",    "a3:p0-0* a0:p0-0*",  // then 1, then 0
      "admit a1 seq 1", "a3:g@11* a1:p0-0*",                       // never more than two live
      "a3:g@12*",
  };
  EXPECT_EQ(log, want);
  EXPECT_TRUE(dag.finished());
}

TEST(BatchPlannerTest, APromptKnownOnlyAtAdmissionIsPlannedAtItsLength) {
  ReadySet dag = pipeline_dag({{}, {0}});
  BatchPlanner planner(dag, {2, 9}, 20, 3, 16);  // a1's 9: its budget, not its length
  std::vector<std::string> log;
  std::map<size_t, int> sampled;
  while (!planner.finished()) {
    for (const auto& a : planner.admit()) {
      if (a.agent == 1) planner.set_prompt(1, 4);
    }
    const BatchPlan plan = planner.next();
    log.push_back(describe(plan));
    planner.decoded(plan);
    for (const PlannedToken& t : plan.tokens)
      if (t.logits) planner.sampled(t.agent, ++sampled[t.agent] == 2);
  }
  const std::vector<std::string> want = {"a0:p0-1*", "a0:g@22*", "a1:p0-3*", "a1:g@24*"};
  EXPECT_EQ(log, want);
  ReadySet other = pipeline_dag({{}});
  BatchPlanner fed(other, {3}, 0, 2, 8);
  fed.admit();
  fed.next();
  EXPECT_THROW(fed.set_prompt(0, 2), Error) << "its prompt is already being decoded";
}

// A fork tree: a1 and a2 fork from a0, a3 from a2. A finished parent is
// parked (its id and cells kept) until its last child has forked from it;
// each child starts after its parent's last decoded token.
TEST(BatchPlannerTest, ChildrenForkFromTheirParkedParentAfterItsLastDecodedToken) {
  ReadySet dag = pipeline_dag({{}, {0}, {0}, {2}});
  BatchPlanner planner(dag, {3, 2, 2, 2}, 50, 5, 16, 0, {std::nullopt, 0, 0, 2});
  ASSERT_EQ(planner.admit().size(), 1u);
  BatchPlan plan = planner.next();  // a0's prompt at 50..52
  planner.decoded(plan);
  planner.sampled(0, false);
  plan = planner.next();  // its first generated token at 53
  EXPECT_EQ(describe(plan), "a0:g@53*");
  planner.decoded(plan);
  planner.sampled(0, true);  // the second token ends it, undecoded: the children start at 54
  EXPECT_TRUE(planner.take_freed().empty()) << "a parent with children keeps its id";
  EXPECT_EQ(planner.cells(), 4) << "and its cells";
  const std::vector<BatchPlanner::Admission> children = planner.admit();
  ASSERT_EQ(children.size(), 2u);
  EXPECT_EQ(children[0].agent, 1u);
  EXPECT_EQ(children[0].from, 1) << "forked from a0's sequence";
  EXPECT_EQ(children[0].pos0, 54);
  EXPECT_EQ(children[1].agent, 2u);
  EXPECT_EQ(children[1].from, 1);
  EXPECT_NE(children[0].seq, children[1].seq);
  planner.set_prompt(1, 3);
  planner.set_prompt(2, 1);
  plan = planner.next();
  EXPECT_EQ(describe(plan), "a1:p0-2* a2:p0-0*");
  planner.decoded(plan);
  planner.sampled(1, true);
  planner.sampled(2, true);  // a2 parks for a3; a1 frees its id
  const std::vector<BatchPlanner::Admission> grandchild = planner.admit();
  std::vector<SeqId> freed = planner.take_freed();
  std::sort(freed.begin(), freed.end());
  EXPECT_EQ(freed, (std::vector<SeqId>{1, children[0].seq}))
      << "a0 freed once both children forked; a1 finished";
  ASSERT_EQ(grandchild.size(), 1u);
  EXPECT_EQ(grandchild[0].agent, 3u);
  EXPECT_EQ(grandchild[0].from, children[1].seq);
  EXPECT_EQ(grandchild[0].pos0, 55);  // a2's one prompt token at 54; its one answer token undecoded
  planner.set_prompt(3, 2);
  EXPECT_EQ(describe(planner.next()), "a3:p0-1*");
}

// A child that fails before it forks (another dependency failed) releases
// its parked parent too.
TEST(BatchPlannerTest, AParkedParentIsFreedWhenItsChildCanNoLongerRun) {
  ReadySet dag = pipeline_dag({{}, {}, {0, 1}});  // a2 forks from a0 and also waits for a1
  BatchPlanner planner(dag, {1, 1, 1}, 0, 4, 8, 0, {std::nullopt, std::nullopt, 0});
  ASSERT_EQ(planner.admit().size(), 2u);
  const BatchPlan plan = planner.next();
  planner.decoded(plan);
  planner.sampled(0, true);  // parked for a2
  planner.fail(1, ErrorValue{ErrorCode::kInternal, "boom"});
  EXPECT_EQ(dag.status(3), NodeStatus::kDependencyFailed);
  EXPECT_TRUE(planner.admit().empty());
  std::vector<SeqId> freed = planner.take_freed();
  std::sort(freed.begin(), freed.end());
  EXPECT_EQ(freed, (std::vector<SeqId>{1, 2}));
  EXPECT_EQ(planner.cells(), 0);
  EXPECT_TRUE(planner.finished());
}

// Streaming prefill: the prefix's tokens fill the room the branches leave;
// an agent starts once the prefix is decoded past its watermark, at that
// watermark; an agent that reads it all waits for the whole prefix.
TEST(BatchPlannerTest, WatermarkAgentsStartDuringAStreamingPrefill) {
  ReadySet dag = pipeline_dag({{}, {}});
  BatchPlanner planner(dag, {2, 1}, 10, 3, 4);
  planner.set_watermarks({3, 10});
  planner.stream_prefix(10);
  const std::vector<std::string> log = drive(planner, {2, 1});
  const std::vector<std::string> want = {
      "d0-3",                             // the prefix alone, n_batch at a time
      "admit a0 seq 1", "a0:p0-1* d4-5",  // a0 needs 3: its prompt at 3.. beside the prefix
      "a0:g@5* d6-8",   "d9-9",           // a0 is done; a1 waits for the last prefix token
      "admit a1 seq 1", "a1:p0-0*",
  };
  EXPECT_EQ(log, want);
  EXPECT_FALSE(planner.streaming());
}

TEST(BatchPlannerTest, AFailedPrefillStepFailsEveryAgent) {
  ReadySet dag = pipeline_dag({{}, {}, {0}});
  BatchPlanner planner(dag, {1, 1, 1}, 8, 4, 4);
  planner.set_watermarks({2, 8, 8});
  planner.stream_prefix(8);
  planner.decoded(planner.next());  // d0-3
  ASSERT_EQ(planner.admit().size(), 1u);
  planner.next();
  planner.fail_all(ErrorValue{ErrorCode::kNoKvSlot, "full"});
  EXPECT_TRUE(dag.finished());
  EXPECT_EQ(dag.status(1), NodeStatus::kFailed);
  EXPECT_EQ(dag.status(2), NodeStatus::kFailed);
  EXPECT_EQ(dag.status(3), NodeStatus::kDependencyFailed);
}

TEST(BatchPlannerTest, RefusesAnNBatchThatCannotHoldEveryGeneratingBranch) {
  ReadySet dag = pipeline_dag({{}, {}});
  EXPECT_THROW(BatchPlanner(dag, {1, 1}, 0, 4, 3), Error);
  EXPECT_THROW(BatchPlanner(dag, {1, 1}, 0, 1, 8), Error);
}

}  // namespace
}  // namespace swarmkv::detail
