#include "swarmkv/error.h"

#include <optional>
#include <set>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

namespace swarmkv {
namespace {

TEST(ErrorTest, WhatCarriesTheStableCodeNameAndTheMessage) {
  const Error e(ErrorCode::kBudget, "prefix_tokens 10 > n_ctx 8");
  EXPECT_EQ(e.code(), ErrorCode::kBudget);
  EXPECT_EQ(e.message(), "prefix_tokens 10 > n_ctx 8");
  EXPECT_STREQ(e.what(), "budget: prefix_tokens 10 > n_ctx 8");
}

TEST(ErrorTest, EveryCodeHasADistinctName) {
  std::set<std::string> names;
  for (int c = static_cast<int>(ErrorCode::kInvalidArgument);
       c <= static_cast<int>(ErrorCode::kInternal); ++c) {
    const std::string name(to_string(static_cast<ErrorCode>(c)));
    EXPECT_NE(name, "unknown") << "code " << c;
    EXPECT_TRUE(names.insert(name).second) << "duplicate name " << name;
  }
}

TEST(ErrorTest, IsCatchableAsRuntimeError) {
  try {
    throw Error(ErrorCode::kIo, "disk full");
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "io: disk full");
    return;
  }
  FAIL() << "not caught as std::runtime_error";
}

TEST(ErrorTest, CurrentErrorValueKeepsTheCodeOfAnError) {
  try {
    throw Error(ErrorCode::kNoKvSlot, "no slot for 12 tokens");
  } catch (...) {
    EXPECT_EQ(current_error_value(), (ErrorValue{ErrorCode::kNoKvSlot, "no slot for 12 tokens"}));
  }
  try {
    throw std::out_of_range("index 7");
  } catch (...) {
    EXPECT_EQ(current_error_value(), (ErrorValue{ErrorCode::kInternal, "index 7"}));
  }
  try {
    throw 1;
  } catch (...) {
    EXPECT_EQ(current_error_value(), (ErrorValue{ErrorCode::kInternal, "unknown exception"}));
  }
}

TEST(ErrorTest, ValueRoundTripsAndOwnsItsMessage) {
  std::optional<ErrorValue> kept;
  {
    const Error e(ErrorCode::kState, std::string(100, 'y'));
    kept = e.value();
    EXPECT_NE(kept->message.data(), e.message().data());
  }
  EXPECT_EQ(kept->to_string(), "state: " + std::string(100, 'y'));
  const Error again(*kept);
  EXPECT_EQ(again.code(), ErrorCode::kState);
  EXPECT_EQ(std::string(again.what()), kept->to_string());
}

}  // namespace
}  // namespace swarmkv
