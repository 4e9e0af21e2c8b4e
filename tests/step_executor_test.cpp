// The step executor without a model: a scripted decoder records each batch
// it is asked to decode and answers each sample with the next scripted
// token; the executor's batches, cells, row order and failures are checked
// against it.
#include "kv/step_executor.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>

namespace swarmkv::detail {
namespace {

class NullKv final : public KvOps {
 public:
  void seq_cp(SeqId, SeqId, Pos, Pos) override {}
  void seq_rm(SeqId) override {}
  void memory_clear() override {}
};

class ScriptedDecoder final : public StepDecoder {
 public:
  void decode(std::span<const BatchToken> batch) override {
    std::string line;
    for (const BatchToken& t : batch)
      line += fmt::format("{}@{}:{}{} ", t.token, t.seq, t.pos, t.logits ? "*" : "");
    batches.push_back(line);
    if (fail_next) {
      fail_next = false;
      throw Error(ErrorCode::kNoKvSlot, "scripted decode failure");
    }
  }
  Token sample(StepSequence& s, int32_t row) override {
    rows.push_back(row);
    if (s.tokens.empty()) throw Error(ErrorCode::kCorruption, "scripted NaN");
    return 100 + row;
  }
  bool accept(StepSequence&, Token token) override { return token == done_token; }
  // Row r scores `token` at -(r + token / 1000); the top alternatives are
  // the tokens 0.. with -1 - rank each.
  SampledLogprobs score(int32_t row, Token token, int32_t top) override {
    scored.push_back(fmt::format("{}@{}", token, row));
    if (token == fail_score_of) throw Error(ErrorCode::kCorruption, "scripted NaN row");
    SampledLogprobs s;
    s.sampled = {token, -(static_cast<float>(row) + static_cast<float>(token) / 1000.0f), ""};
    for (int32_t i = 0; i < top; ++i) s.top.push_back({i, -1.0f - static_cast<float>(i), ""});
    return s;
  }

  std::vector<std::string> batches;
  std::vector<std::string> scored;
  Token fail_score_of = -1;
  std::vector<int32_t> rows;
  bool fail_next = false;
  Token done_token = -1;
};

struct Harness {
  NullKv kv;
  SequenceTable table{kv, 4, /*keep_cells=*/false};
  ScriptedDecoder decoder;
  StepExecutor executor{decoder, table};
  std::vector<StepSequence> seqs = std::vector<StepSequence>(4);
  std::vector<std::string> events;

  StepExecutor::Callbacks callbacks() {
    StepExecutor::Callbacks on;
    on.failed = [&](std::span<const size_t> owners, const ErrorValue& e) {
      std::string who;
      for (const size_t o : owners) who += fmt::format("{} ", o);
      events.push_back(fmt::format("failed {}({})", who, e.message));
    };
    on.decoded = [&](double ms) {
      EXPECT_GE(ms, 0.0);
      events.push_back("decoded");
      return true;
    };
    on.sampled = [&](size_t owner, Token token, bool done) {
      events.push_back(fmt::format("sampled {} {}{}", owner, token, done ? " done" : ""));
    };
    on.sample_failed = [&](size_t owner, const ErrorValue& e) {
      events.push_back(fmt::format("sample_failed {} ({})", owner, e.message));
    };
    return on;
  }
  StepExecutor::Owners owners() {
    return [this](size_t o) { return &seqs[o]; };
  }
};

TEST(StepExecutorTest, FillsOneBatchRecordsCellsAndSamplesEachRowInBatchOrder) {
  Harness h;
  h.seqs[0].tokens = {1, 2, 3};
  h.seqs[1].tokens = {7};
  h.seqs[1].next = 42;  // generating: its last sampled token
  const std::vector<StepToken> plan = {
      {.owner = 1, .seq = 1, .pos = 5, .prompt_index = -1, .logits = true},
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .logits = false},
      {.owner = 0, .seq = 0, .pos = 1, .prompt_index = 1, .logits = false},
      {.owner = 0, .seq = 0, .pos = 2, .prompt_index = 2, .logits = true},
  };
  h.table.decoded(1, 5);
  EXPECT_TRUE(h.executor.run(plan, h.owners(), h.callbacks()));
  EXPECT_EQ(h.decoder.batches, (std::vector<std::string>{"42@1:5* 1@0:0 2@0:1 3@0:2* "}));
  EXPECT_EQ(h.table.length(0), 3U);
  EXPECT_EQ(h.table.length(1), 6U);
  EXPECT_EQ(h.decoder.rows, (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(h.events, (std::vector<std::string>{"decoded", "sampled 1 100", "sampled 0 103"}));
  EXPECT_EQ(h.seqs[0].next, 103);  // decoded in the next step
  EXPECT_EQ(h.seqs[1].next, 100);
}

TEST(StepExecutorTest, SamplesInTheCallersOrderWhenGivenOne) {
  Harness h;
  h.seqs[0].tokens = {1};
  h.seqs[2].tokens = {5};
  const std::vector<StepToken> plan = {
      {.owner = 2, .seq = 2, .pos = 0, .prompt_index = 0, .logits = true},
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .logits = true},
  };
  const std::vector<size_t> order = {0, 1, 2};  // 1 has no row: skipped
  EXPECT_TRUE(h.executor.run(plan, h.owners(), h.callbacks(), order));
  EXPECT_EQ(h.events, (std::vector<std::string>{"decoded", "sampled 0 101", "sampled 2 100"}));
}

TEST(StepExecutorTest, AFailedDecodeFailsEveryOwnerInTheStepOnceAndRecordsNothing) {
  Harness h;
  h.seqs[0].tokens = {1, 2};
  h.seqs[3].tokens = {9};
  h.decoder.fail_next = true;
  const std::vector<StepToken> plan = {
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .logits = false},
      {.owner = 3, .seq = 3, .pos = 0, .prompt_index = 0, .logits = true},
      {.owner = 0, .seq = 0, .pos = 1, .prompt_index = 1, .logits = true},
  };
  EXPECT_FALSE(h.executor.run(plan, h.owners(), h.callbacks()));
  EXPECT_EQ(h.events, (std::vector<std::string>{"failed 0 3 (scripted decode failure)"}));
  EXPECT_EQ(h.table.length(0), 0U);
  EXPECT_EQ(h.table.length(3), 0U);
  EXPECT_TRUE(h.decoder.rows.empty());
}

TEST(StepExecutorTest, AFailedSampleFailsItsOwnerAloneAndADoneAnswerKeepsItsNextToken) {
  Harness h;
  h.seqs[0].tokens = {1};
  h.seqs[1].tokens = {2};
  h.seqs[1].next = 7;
  h.decoder.done_token = 101;  // owner 1's row
  const std::vector<StepToken> plan = {
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .logits = true},
      {.owner = 1, .seq = 1, .pos = 0, .prompt_index = 0, .logits = true},
      {.owner = 2, .seq = 2, .pos = 0, .prompt_index = -1, .logits = true},
  };
  // Owner 2 has no tokens: the scripted sampler throws for it.
  EXPECT_TRUE(h.executor.run(plan, h.owners(), h.callbacks()));
  EXPECT_EQ(h.events, (std::vector<std::string>{"decoded", "sampled 0 100", "sampled 1 101 done",
                                                "sample_failed 2 (scripted NaN)"}));
  EXPECT_EQ(h.seqs[1].next, 7);  // a completed answer's last token is never decoded
}

TEST(StepExecutorTest, AnOwnerThatLeftIsSkippedAndDecodedCanStopTheSampling) {
  Harness h;
  h.seqs[0].tokens = {1};
  h.seqs[1].tokens = {2};
  const std::vector<StepToken> plan = {
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .logits = true},
      {.owner = 1, .seq = 1, .pos = 0, .prompt_index = 0, .logits = true},
  };
  bool gone = false;
  auto on = h.callbacks();
  on.sampled = [&](size_t owner, Token, bool) {
    h.events.push_back(fmt::format("sampled {}", owner));
    gone = true;  // owner 0's outcome failed owner 1's request too
  };
  EXPECT_TRUE(h.executor.run(
      plan, [&](size_t o) { return o == 1 && gone ? nullptr : &h.seqs[o]; }, on));
  EXPECT_EQ(h.events, (std::vector<std::string>{"decoded", "sampled 0"}));

  on.decoded = [&](double) { return false; };  // e.g. a progress callback threw
  h.events.clear();
  EXPECT_FALSE(h.executor.run(plan, h.owners(), on));
  EXPECT_TRUE(h.events.empty());
  EXPECT_EQ(h.table.length(0), 2U);  // the decode happened: its cells are recorded
}

TEST(StepExecutorTest, ScoringRowsScoreTheirNextPromptTokenBeforeAnythingIsSampled) {
  Harness h;
  h.seqs[0].tokens = {11, 12, 13, 14};
  h.seqs[0].prompt_scores = std::make_shared<std::vector<SampledLogprobs>>();
  h.seqs[0].score_top = 2;
  h.seqs[1].tokens = {7};
  h.seqs[1].next = 42;
  // Owner 0's first chunk (rows 1, 2 score tokens 12, 13), then its second
  // with the sampling row.
  std::vector<StepToken> plan = {
      {.owner = 1, .seq = 1, .pos = 1, .prompt_index = -1, .logits = true},
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .score = true},
      {.owner = 0, .seq = 0, .pos = 1, .prompt_index = 1, .score = true},
  };
  h.table.decoded(1, 1);
  EXPECT_TRUE(h.executor.run(plan, h.owners(), h.callbacks()));
  EXPECT_EQ(h.decoder.batches, (std::vector<std::string>{"42@1:1* 11@0:0* 12@0:1* "}));
  EXPECT_EQ(h.decoder.scored, (std::vector<std::string>{"12@1", "13@2"}));
  EXPECT_EQ(h.decoder.rows, (std::vector<int32_t>{0}));  // the scoring rows are not sampled
  EXPECT_EQ(h.events, (std::vector<std::string>{"decoded", "sampled 1 100"}));
  plan = {
      {.owner = 0, .seq = 0, .pos = 2, .prompt_index = 2, .score = true},
      {.owner = 0, .seq = 0, .pos = 3, .prompt_index = 3, .logits = true},
  };
  EXPECT_TRUE(h.executor.run(plan, h.owners(), h.callbacks()));
  EXPECT_EQ(h.decoder.scored.back(), "14@0");
  const std::vector<SampledLogprobs>& scores = *h.seqs[0].prompt_scores;
  ASSERT_EQ(scores.size(), 3U);  // tokens 1..3: the first has nothing before it
  EXPECT_EQ(scores[0].sampled.token, 12);
  EXPECT_FLOAT_EQ(scores[0].sampled.logprob, -1.012f);
  EXPECT_EQ(scores[2].sampled.token, 14);
  EXPECT_EQ(scores[2].top.size(), 2U);
  EXPECT_EQ(h.events.back(), "sampled 0 101");
}

TEST(StepExecutorTest, AFailedScoreFailsItsOwnerAloneWhichThenSamplesNothing) {
  Harness h;
  h.seqs[0].tokens = {11, 12};
  h.seqs[0].prompt_scores = std::make_shared<std::vector<SampledLogprobs>>();
  h.seqs[1].tokens = {5};
  h.decoder.fail_score_of = 12;
  const std::vector<StepToken> plan = {
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .score = true},
      {.owner = 0, .seq = 0, .pos = 1, .prompt_index = 1, .logits = true},
      {.owner = 1, .seq = 1, .pos = 0, .prompt_index = 0, .logits = true},
  };
  EXPECT_TRUE(h.executor.run(plan, h.owners(), h.callbacks()));
  EXPECT_EQ(h.events, (std::vector<std::string>{"decoded", "sample_failed 0 (scripted NaN row)",
                                                "sampled 1 102"}));
  EXPECT_TRUE(h.seqs[0].prompt_scores->empty());
}

TEST(StepExecutorTest, AScoringRowWithoutANextPromptTokenOrAPlaceIsAnInternalError) {
  Harness h;
  h.seqs[0].tokens = {11, 12};
  const std::vector<StepToken> no_place = {
      {.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0, .score = true}};
  h.seqs[0].prompt_scores = std::make_shared<std::vector<SampledLogprobs>>();
  const std::vector<StepToken> last = {
      {.owner = 0, .seq = 0, .pos = 1, .prompt_index = 1, .score = true}};
  for (const auto* plan : {&last, &no_place}) {
    if (plan == &no_place) h.seqs[0].prompt_scores.reset();
    try {
      h.executor.run(*plan, h.owners(), h.callbacks());
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
    }
  }
  EXPECT_TRUE(h.decoder.batches.empty());
}

TEST(StepExecutorTest, APlannedTokenOfAnOwnerWithoutASequenceIsAnInternalError) {
  Harness h;
  const std::vector<StepToken> plan = {{.owner = 0, .seq = 0, .pos = 0, .prompt_index = 0}};
  try {
    h.executor.run(
        plan, [](size_t) -> StepSequence* { return nullptr; }, h.callbacks());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
  EXPECT_TRUE(h.decoder.batches.empty());
}

}  // namespace
}  // namespace swarmkv::detail
