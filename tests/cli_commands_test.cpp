// The command line's shared pieces: the sampling flags walked from
// for_each_sampling_field, and the one memory refusal that `generate` shares
// with the runner (require_memory).
#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>
#include <CLI/CLI.hpp>

#include "sampling_flags.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"

namespace swarmkv {
namespace {

void parse(CLI::App& app, std::vector<std::string> args) {
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  app.parse(args);
}

TEST(SamplingFlagsTest, EveryFieldIsSetByItsFlag) {
  CLI::App app;
  SamplingOptions parsed;
  cli::add_sampling_flags(&app, parsed);
  parse(app, {"--temp",
              "0.5",
              "--top-p",
              "0.875",
              "--top-k",
              "7",
              "--min-p",
              "0.0625",
              "--seed",
              "9",
              "--repeat-penalty",
              "1.25",
              "--repeat-last-n",
              "32",
              "--frequency-penalty",
              "0.25",
              "--presence-penalty",
              "0.125",
              "--dry-multiplier",
              "0.75",
              "--dry-base",
              "2",
              "--dry-allowed-length",
              "3",
              "--dry-penalty-last-n",
              "128",
              "--top-logprobs",
              "5"});
  SamplingOptions want;
  want.temperature = 0.5f;
  want.top_p = 0.875f;
  want.top_k = 7;
  want.min_p = 0.0625f;
  want.seed = 9;
  want.repeat_penalty = 1.25f;
  want.repeat_last_n = 32;
  want.frequency_penalty = 0.25f;
  want.presence_penalty = 0.125f;
  want.dry_multiplier = 0.75f;
  want.dry_base = 2.0f;
  want.dry_allowed_length = 3;
  want.dry_penalty_last_n = 128;
  want.top_logprobs = 5;
  // Every field differs from its default, so a flag bound to the wrong field shows.
  SamplingOptions defaults;
  for_each_sampling_field(defaults, [&](const char* key, auto& value, int64_t) {
    SamplingOptions probe = want;
    for_each_sampling_field(probe, [&](const char* k, auto& v, int64_t) {
      if (std::string(k) == key) v = static_cast<std::remove_reference_t<decltype(v)>>(value);
    });
    EXPECT_NE(probe, want) << key << " has its default in the test";
  });
  EXPECT_EQ(parsed, want);
}

TEST(SamplingFlagsTest, OneFlagPerFieldWithItsDefaultShown) {
  CLI::App app;
  SamplingOptions s;
  cli::add_sampling_flags(&app, s);
  int fields = 0;
  for_each_sampling_field(s, [&](const char*, auto&, int64_t) { ++fields; });
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_name() == "--help") continue;
    names.push_back(o->get_name());
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(fields));
  const std::vector<std::string> want = {"--temp",
                                         "--top-p",
                                         "--top-k",
                                         "--min-p",
                                         "--seed",
                                         "--repeat-penalty",
                                         "--repeat-last-n",
                                         "--frequency-penalty",
                                         "--presence-penalty",
                                         "--dry-multiplier",
                                         "--dry-base",
                                         "--dry-allowed-length",
                                         "--dry-penalty-last-n",
                                         "--top-logprobs"};
  EXPECT_EQ(names, want);  // the order --help lists them in
  EXPECT_EQ(app.get_option("--top-p")->get_default_str(), "1");
  EXPECT_EQ(app.get_option("--dry-penalty-last-n")->get_default_str(), "256");
}

TEST(SamplingFlagsTest, TemperatureOutsideItsRangeIsAParseError) {
  CLI::App app;
  SamplingOptions s;
  cli::add_sampling_flags(&app, s);
  EXPECT_THROW(parse(app, {"--temp", "101"}), CLI::ValidationError);
  EXPECT_THROW(parse(app, {"--temp", "-1"}), CLI::ValidationError);
  EXPECT_THROW(parse(app, {"--top-logprobs", "21"}), CLI::ValidationError);
  EXPECT_THROW(parse(app, {"--top-logprobs", "-2"}), CLI::ValidationError);
}

TEST(RequireMemoryTest, ARefusalNamesEveryNumberAndTheRemedy) {
  try {
    require_memory(uint64_t{1} << 62, "n_ctx 4096", "KV 1.00 GiB + attention scratch 2.00 GiB",
                   "lower --n-ctx");
    FAIL() << "4 EiB fit";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBudget);
    const std::string m = e.message();
    EXPECT_EQ(m.rfind("not enough memory: n_ctx 4096 needs about 4294967296.00 GiB (KV 1.00 GiB "
                      "+ attention scratch 2.00 GiB; with headroom ",
                      0),
              0u)
        << m;
    EXPECT_NE(m.find(" GiB is available ("), std::string::npos) << m;
    EXPECT_EQ(m.substr(m.size() - 15), "; lower --n-ctx") << m;
  }
}

TEST(RequireMemoryTest, WhatFitsPasses) {
  EXPECT_NO_THROW(require_memory(0, "n_ctx 16", "KV 0.00 GiB", "lower --n-ctx"));
}

}  // namespace
}  // namespace swarmkv
