// Engine behaviour that needs no model file.
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "engine/decode_status.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv {
namespace {

ErrorCode decode_error(int32_t rc) {
  try {
    detail::check_decode(rc, 7, ContextOptions{});
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "rc " << rc << " did not throw";
  return ErrorCode::kInternal;
}

TEST(DecodeStatusTest, EveryLlamaDecodeReturnCodeMapsToItsOwnError) {
  EXPECT_NO_THROW(detail::check_decode(0, 7, ContextOptions{}));
  EXPECT_EQ(decode_error(1), ErrorCode::kNoKvSlot);
  EXPECT_EQ(decode_error(2), ErrorCode::kAborted);
  EXPECT_EQ(decode_error(-1), ErrorCode::kInvalidBatch);
  EXPECT_EQ(decode_error(-2), ErrorCode::kDecodeFatal);
  EXPECT_EQ(decode_error(-100), ErrorCode::kDecodeFatal);
  EXPECT_EQ(decode_error(3), ErrorCode::kInternal);
}

TEST(DecodeStatusTest, NoKvSlotMessageNamesTheNumbers) {
  ContextOptions options;
  options.n_ctx = 256;
  options.n_seq_max = 4;
  try {
    detail::check_decode(1, 99, options);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("99 tokens"), std::string::npos) << what;
    EXPECT_NE(what.find("n_ctx 256"), std::string::npos) << what;
    EXPECT_NE(what.find("n_seq_max 4"), std::string::npos) << what;
  }
}

TEST(ModelLoadTest, MissingFileIsNotFound) {
  try {
    Model::load("/nonexistent/model.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("/nonexistent/model.gguf"), std::string::npos);
  }
}

// Under ASan this also proves nothing leaks when llama.cpp rejects the file.
TEST(ModelLoadTest, GarbageFileIsAModelLoadErrorNamingThePath) {
  const auto path = std::filesystem::temp_directory_path() / "swarmkv_garbage.gguf";
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 4096; ++i) out.put(static_cast<char>((i * 131) & 0xff));
  }
  try {
    Model::load(path.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kModelLoad);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
  std::filesystem::remove(path);
}

TEST(BatchTest, RejectsBadSizesAndOverflow) {
  EXPECT_THROW(Batch(0, 1), Error);
  EXPECT_THROW(Batch(4, 0), Error);
  Batch batch(2, 2);
  batch.add(1, 0, 0, false);
  const SeqId two[] = {0, 1};
  batch.add(2, 1, two, true);
  EXPECT_EQ(batch.size(), 2);
  EXPECT_THROW(batch.add(3, 2, 0, false), Error);
  batch.clear();
  EXPECT_EQ(batch.size(), 0);
  const SeqId three[] = {0, 1, 2};
  EXPECT_THROW(batch.add(1, 0, three, false), Error);
  EXPECT_THROW(batch.add(1, 0, std::span<const SeqId>(), false), Error);
}

TEST(SamplerTest, RejectsInvalidSettings) {
  const auto error = [](const SamplingOptions& o) {
    try {
      validate_sampling(o);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  SamplingOptions bad_p;
  bad_p.temperature = 0.8f;
  bad_p.top_p = 0.0f;
  EXPECT_EQ(error(bad_p),
            "invalid_argument: need temperature >= 0, top_p in (0, 1], top_k >= 0 (got 0.8, 0, 0)");
  SamplingOptions bad_k;
  bad_k.top_k = -1;
  EXPECT_NE(error(bad_k), "no error");
  SamplingOptions bad_t;
  bad_t.temperature = -1.0f;
  EXPECT_NE(error(bad_t), "no error") << "a negative temperature is an error, not greedy";
  SamplingOptions bad_min_p;
  bad_min_p.min_p = 1.5f;
  EXPECT_EQ(error(bad_min_p), "invalid_argument: need min_p in [0, 1] (got 1.5)");
  SamplingOptions bad_bias;
  bad_bias.logit_bias = {{3, 1.0f}, {5, std::numeric_limits<float>::infinity()}};
  EXPECT_EQ(error(bad_bias),
            "invalid_argument: logit_bias: need finite biases (got inf for token 5)");
  SamplingOptions outside;
  outside.logit_bias = {{100, 1.0f}};
  EXPECT_EQ(error(outside), "no error");  // no vocabulary to check against
  try {
    validate_sampling(outside, 100);
    ADD_FAILURE() << "token 100 of a 100-token vocabulary passed";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "invalid_argument: logit_bias: token 100 is not in the model's vocabulary (ids 0 "
                 "to 99)");
  }
  SamplingOptions bad_repeat;
  bad_repeat.repeat_penalty = 0.0f;
  EXPECT_EQ(error(bad_repeat),
            "invalid_argument: need repeat_penalty > 0, repeat_last_n >= 0, frequency_penalty and "
            "presence_penalty finite (got 0, 64, 0, 0)");
  SamplingOptions bad_dry;
  bad_dry.dry_multiplier = 0.8f;
  bad_dry.dry_base = 0.5f;
  EXPECT_EQ(error(bad_dry),
            "invalid_argument: need dry_multiplier >= 0, dry_base >= 1, dry_allowed_length >= 1, "
            "dry_penalty_last_n >= 1 (got 0.8, 0.5, 2, 256)");
  SamplingOptions ok;
  ok.temperature = 0.7f;
  ok.top_p = 0.9f;
  ok.top_k = 40;
  ok.repeat_penalty = 1.2f;
  ok.frequency_penalty = 0.5f;
  ok.dry_multiplier = 0.8f;
  EXPECT_EQ(error(ok), "no error");
  EXPECT_TRUE(ok.penalties_on());
  EXPECT_FALSE(SamplingOptions{}.penalties_on()) << "plain greedy by default";
}

TEST(StopReasonTest, HasStableNames) {
  EXPECT_EQ(to_string(StopReason::kEndOfGeneration), "eog");
  EXPECT_EQ(to_string(StopReason::kMaxTokens), "max_tokens");
  EXPECT_EQ(to_string(StopReason::kStopString), "stop_string");
}

}  // namespace
}  // namespace swarmkv
