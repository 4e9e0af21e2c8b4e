// Engine behaviour that needs no model file.
#include <filesystem>
#include <fstream>
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
  SamplingOptions bad_p;
  bad_p.temperature = 0.8f;
  bad_p.top_p = 0.0f;
  EXPECT_THROW(Sampler{bad_p}, Error);
  SamplingOptions bad_k;
  bad_k.top_k = -1;
  EXPECT_THROW(Sampler{bad_k}, Error);
  SamplingOptions bad_t;
  bad_t.temperature = -1.0f;
  EXPECT_THROW(Sampler{bad_t}, Error) << "a negative temperature is an error, not greedy";
  SamplingOptions ok;
  ok.temperature = 0.7f;
  ok.top_p = 0.9f;
  ok.top_k = 40;
  EXPECT_NO_THROW(Sampler{ok});
}

TEST(StopReasonTest, HasStableNames) {
  EXPECT_EQ(to_string(StopReason::kEndOfGeneration), "eog");
  EXPECT_EQ(to_string(StopReason::kMaxTokens), "max_tokens");
  EXPECT_EQ(to_string(StopReason::kStopString), "stop_string");
}

}  // namespace
}  // namespace swarmkv
