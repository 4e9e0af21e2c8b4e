#include "sampling_flags.h"

#include <algorithm>
#include <iterator>
#include <string_view>

#include <fmt/format.h>

#include "swarmkv/error.h"

namespace swarmkv::cli {
namespace {

struct SamplingFlag {
  std::string_view key;  // for_each_sampling_field's name (the pipeline file's key)
  const char* name;
  const char* help;
  float most = 0;   // > 0: the parser accepts least..most only
  float least = 0;  // with most
};

// llama.cpp's flag names (--temp, not --temperature), in for_each_sampling_field's order.
constexpr SamplingFlag kSamplingFlags[] = {
    {"temperature", "--temp", "sampling temperature; 0 = greedy", 100.0f},
    {"top_p", "--top-p", "nucleus sampling mass (1 = off)"},
    {"top_k", "--top-k", "keep the k most likely tokens (0 = off)"},
    {"min_p", "--min-p", "drop tokens less likely than this x the likeliest token (0 = off)", 1.0f},
    {"seed", "--seed", "RNG seed for sampled generation"},
    {"repeat_penalty", "--repeat-penalty",
     "divide the logit of a token generated within the last --repeat-last-n by this (1 = off; "
     "the prompt is not counted)"},
    {"repeat_last_n", "--repeat-last-n", "generated tokens the penalties look back over (0 = off)"},
    {"frequency_penalty", "--frequency-penalty",
     "subtract this x a token's count so far (0 = off)"},
    {"presence_penalty", "--presence-penalty", "subtract this once a token occurred (0 = off)"},
    {"dry_multiplier", "--dry-multiplier",
     "DRY: penalise a token that extends a repeated sequence (0 = off)"},
    {"dry_base", "--dry-base", "DRY: growth of the penalty"},
    {"dry_allowed_length", "--dry-allowed-length", "DRY: repeats up to this many tokens go free"},
    {"dry_penalty_last_n", "--dry-penalty-last-n", "DRY: generated tokens it looks back over"},
    {"top_logprobs", "--top-logprobs",
     "record each answer token's log probability and this many likeliest tokens' (0..20; -1 = "
     "off; --json's logprobs, after the answer in text)",
     20.0f, -1.0f},
};

}  // namespace

void add_sampling_flags(CLI::App* app, SamplingOptions& sampling) {
  for_each_sampling_field(sampling, [&](const char* key, auto& value, int64_t) {
    const auto* flag = std::find_if(std::begin(kSamplingFlags), std::end(kSamplingFlags),
                                    [&](const SamplingFlag& f) { return f.key == key; });
    if (flag == std::end(kSamplingFlags)) {
      throw Error(ErrorCode::kInternal,
                  fmt::format("the sampling setting '{}' has no command-line flag", key));
    }
    CLI::Option* option = app->add_option(flag->name, value, flag->help)->capture_default_str();
    if (flag->most > 0) option->check(CLI::Range(flag->least, flag->most));
  });
}

}  // namespace swarmkv::cli
