// The one step composition, without a model. The shared fork's planner and
// `serve`'s scheduler both compose their steps with StepComposer; these
// tests drive it as each of them does (the planner's own tests and the
// server tests then check the callers).
#include "kv/step_composer.h"

#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "swarmkv/error.h"

namespace swarmkv::detail {
namespace {

// "o1:g@12*" = owner 1's generated token at position 12 (its logits
// sampled); "o2:p3@7" = owner 2's prompt token 3 at position 7 ("s": its
// row scores the prompt token after it).
std::vector<std::string> describe(const StepComposer& step) {
  std::vector<std::string> out;
  for (const StepToken& t : step.tokens()) {
    out.push_back(fmt::format("o{}:{}@{}{}{}", t.owner,
                              t.prompt_index < 0 ? "g" : fmt::format("p{}", t.prompt_index), t.pos,
                              t.logits ? "*" : "", t.score ? "s" : ""));
  }
  return out;
}

TEST(StepComposerTest, GeneratedTokensFirstThenPromptsInTheGivenOrderWhileTheyFit) {
  StepComposer step(6);
  EXPECT_TRUE(step.generating(4, 4, 20));
  EXPECT_TRUE(step.generating(2, 2, 31));
  EXPECT_EQ(step.prefill(7, 7, 10, 0, 3, 2), 3);  // a whole short prompt: logits on its last
  EXPECT_EQ(step.prefill(1, 1, 10, 0, 5, 4), 1);  // room for one more token only
  EXPECT_EQ(step.prefill(3, 3, 10, 0, 5, 4), 0);
  EXPECT_FALSE(step.has_room());
  EXPECT_EQ(describe(step), (std::vector<std::string>{"o4:g@20*", "o2:g@31*", "o7:p0@10",
                                                      "o7:p1@11", "o7:p2@12*", "o1:p0@10"}));
}

// As `serve` composes: a prompt resumes at its decoded length and its chunk
// ends where a waiting request forks from it (no logits before its end).
TEST(StepComposerTest, ACompletionsChunkResumesAndStopsWhereAWaiterForks) {
  StepComposer step(512);
  EXPECT_EQ(step.prefill(0, 0, 0, 100, 104, 199), 4);
  EXPECT_EQ(describe(step),
            (std::vector<std::string>{"o0:p100@100", "o0:p101@101", "o0:p102@102", "o0:p103@103"}));
}

// As the shared fork composes: a branch's prompt after the document, and
// the streamed document filling the room left, without logits.
TEST(StepComposerTest, ABranchPromptThenTheStreamedDocumentInTheRoomLeft) {
  StepComposer step(5);
  EXPECT_TRUE(step.generating(0, 1, 40));
  EXPECT_EQ(step.prefill(1, 2, 30, 0, 2, 1), 2);
  EXPECT_EQ(step.prefill(99, 0, 0, 28, 100, -1), 2);
  EXPECT_EQ(describe(step), (std::vector<std::string>{"o0:g@40*", "o1:p0@30", "o1:p1@31*",
                                                      "o99:p28@28", "o99:p29@29"}));
}

// An echoed prompt's logprobs (serve's /v1/completions): every row before
// the prompt's last token scores the token after it, in each chunk; the
// last samples, or (max_tokens 0) has no output row at all.
TEST(StepComposerTest, AScoredPromptHasEveryRowButItsLastScoringInEachChunk) {
  StepComposer step(4);
  EXPECT_EQ(step.prefill(0, 0, 0, 0, 3, 2, /*score_until=*/2), 3);
  EXPECT_EQ(step.prefill(1, 1, 0, 0, 3, 2), 1);
  EXPECT_EQ(describe(step),
            (std::vector<std::string>{"o0:p0@0s", "o0:p1@1s", "o0:p2@2*", "o1:p0@0"}));
  StepComposer next(2);
  EXPECT_EQ(next.prefill(5, 5, 0, 4, 9, 8, /*score_until=*/8), 2);
  EXPECT_EQ(describe(next), (std::vector<std::string>{"o5:p4@4s", "o5:p5@5s"}));
  StepComposer unsampled(4);
  EXPECT_EQ(unsampled.prefill(2, 2, 0, 0, 3, -1, /*score_until=*/2), 3);
  EXPECT_EQ(describe(unsampled), (std::vector<std::string>{"o2:p0@0s", "o2:p1@1s", "o2:p2@2"}));
}

TEST(StepComposerTest, AFullStepTakesNothingAndAGeneratedTokenAfterAPromptIsABug) {
  StepComposer full(1);
  EXPECT_TRUE(full.generating(0, 0, 0));
  EXPECT_FALSE(full.generating(1, 1, 0));
  EXPECT_EQ(full.tokens().size(), 1u);
  StepComposer step(4);
  step.prefill(0, 0, 0, 0, 1, 0);
  std::optional<ErrorCode> code;
  try {
    step.generating(1, 1, 5);
  } catch (const Error& e) {
    code = e.code();
  }
  EXPECT_EQ(code, ErrorCode::kInternal);
  code.reset();
  try {
    StepComposer none(0);
  } catch (const Error& e) {
    code = e.code();
  }
  EXPECT_EQ(code, ErrorCode::kInternal);
}

}  // namespace
}  // namespace swarmkv::detail
