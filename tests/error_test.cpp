#include "swarmkv/error.h"

#include <set>
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

}  // namespace
}  // namespace swarmkv
