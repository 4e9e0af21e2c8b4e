#include "swarmkv/log.h"

#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "swarmkv/error.h"

namespace swarmkv {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    saved_ = log_level();
    set_log_sink([this](LogLevel level, std::string_view msg) {
      seen_.emplace_back(level, std::string(msg));
    });
  }
  void TearDown() override {
    set_log_sink({});
    set_log_level(saved_);
  }
  LogLevel saved_ = LogLevel::kWarn;
  std::vector<std::pair<LogLevel, std::string>> seen_;
};

TEST_F(LogTest, MessagesBelowTheLevelAreDropped) {
  set_log_level(LogLevel::kWarn);
  log_info("hidden {}", 1);
  log_warn("shown {}", 2);
  log_error("shown {}", 3);
  ASSERT_EQ(seen_.size(), 2u);
  EXPECT_EQ(seen_[0], std::make_pair(LogLevel::kWarn, std::string("shown 2")));
  EXPECT_EQ(seen_[1].first, LogLevel::kError);
}

TEST_F(LogTest, TrailingNewlinesAreStripped) {
  set_log_level(LogLevel::kDebug);
  log_message(LogLevel::kDebug, "line\n\n");
  ASSERT_EQ(seen_.size(), 1u);
  EXPECT_EQ(seen_[0].second, "line");
}

TEST_F(LogTest, OffSilencesEverything) {
  set_log_level(LogLevel::kOff);
  log_error("nothing");
  EXPECT_TRUE(seen_.empty());
}

TEST(LogLevelTest, ParsesKnownNamesAndRejectsOthersWithTheAcceptedList) {
  EXPECT_EQ(parse_log_level("debug"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("error"), LogLevel::kError);
  EXPECT_EQ(to_string(parse_log_level("info")), "info");
  try {
    parse_log_level("loud");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("debug, info, warn, error or off"), std::string::npos);
  }
}

}  // namespace
}  // namespace swarmkv
