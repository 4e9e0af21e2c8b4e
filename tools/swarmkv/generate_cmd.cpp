#include "generate_cmd.h"

#include <iostream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sampling_flags.h"
#include "swarmkv/chat.h"
#include "swarmkv/error.h"
#include "swarmkv/measure.h"
#include "swarmkv/paths.h"
#include "swarmkv/result_json.h"
#include "terminal_text.h"

namespace swarmkv::cli {
namespace {

void require_stop_strings(const std::vector<std::string>& stop) {
  for (const std::string& s : stop) {
    if (s.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "--stop is empty; it would end every answer before its first token");
    }
  }
}

struct GenerateTimings {
  double load_ms = 0;
  double prompt_ms = 0;
  double generate_ms = 0;
  double total_ms = 0;
};

void print_json(const std::string& model_path, size_t prompt_tokens, const Generation& answer,
                const GenerateTimings& t, const ContextOptions& context) {
  const nlohmann::json out = {
      {"model", model_path},
      {"prompt_tokens", prompt_tokens},
      {"n_tokens", answer.tokens.size()},
      {"answer", answer.text},
      {"stop_reason", std::string(to_string(answer.stop_reason))},
      {"timings_ms",
       {{"load", t.load_ms},
        {"prompt", t.prompt_ms},
        {"generate", t.generate_ms},
        {"total", t.total_ms}}},
      {"n_ctx", context.n_ctx},
      {"n_threads", context.n_threads},
      {"logprobs", logprobs_json(answer.logprobs)},
  };
  std::cout << dump_json(out) << "\n";
}

void print_text(const std::string& model_path, size_t prompt_tokens, const Generation& answer,
                const GenerateTimings& t) {
  std::cout << TerminalText(stdout)(answer.text) << "\n";
  std::cerr << fmt::format(
      "\n[swarmkv] model {} | prompt {} tok in {:.1f} ms ({:.1f} tok/s) | answer {} tok in "
      "{:.1f} ms "
      "({:.1f} tok/s) | stop: {} | total {:.1f} ms\n",
      model_path, prompt_tokens, t.prompt_ms,
      1000.0 * static_cast<double>(prompt_tokens) / t.prompt_ms, answer.tokens.size(),
      t.generate_ms,
      t.generate_ms > 0 ? 1000.0 * static_cast<double>(answer.tokens.size()) / t.generate_ms : 0.0,
      to_string(answer.stop_reason), t.total_ms);
  // --top-logprobs: a line per token, its log probability and piece (as a
  // JSON string: escaped, control characters too), then the likeliest
  // tokens'.
  const auto quoted = [](const std::string& piece) {
    return nlohmann::json(piece).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  for (const SampledLogprobs& s : answer.logprobs) {
    std::string line = fmt::format("{:>10.4f}  {}", s.sampled.logprob, quoted(s.sampled.text));
    for (const TokenLogprob& top : s.top) {
      line += fmt::format("  | {} {:.4f}", quoted(top.text), top.logprob);
    }
    std::cerr << line << "\n";
  }
}

}  // namespace

GenerateCommand::GenerateCommand(CLI::App& app) {
  sub_ = app.add_subcommand(
      "generate",
      "Generate one answer to one prompt (chat template applied; a model without one gets "
      "\"prompt\\nAnswer:\") and print it with its timings");
  sub_->add_option("-m,--model", model_, "GGUF model file (default: see above)");
  auto* prompt_opt = sub_->add_option("-p,--prompt", prompt_, "the user message");
  sub_->add_option("-f,--prompt-file", prompt_file_, "read the user message from a file")
      ->excludes(prompt_opt)
      ->check(CLI::ExistingFile);
  sub_->add_option("--system", system_, "a system message placed before the prompt");
  sub_->add_flag("--raw", raw_, "send the prompt as is, without the model's chat template");
  sub_->add_option("-n,--max-tokens", max_tokens_, "most tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  add_sampling_flags(sub_, sampling_);
  sub_->add_option("--stop", stop_, "stop when the answer ends with this string (repeatable)");
  sub_->add_option("-c,--n-ctx", context_.n_ctx, "context size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 1u << 22));
  sub_->add_option("-b,--n-batch", context_.n_batch, "most tokens per decode call")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  sub_->add_option("-t,--threads", context_.n_threads, "CPU threads (0 = all cores)")
      ->capture_default_str();
  sub_->add_flag("--json", json_, "print one JSON object instead of text");
}

std::string GenerateCommand::read_prompt() const {
  std::string prompt = prompt_file_.empty() ? prompt_ : read_file(prompt_file_, "--prompt-file");
  if (prompt.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "the prompt is empty (use --prompt or --prompt-file)");
  }
  require_text(prompt, prompt_file_.empty() ? std::string("--prompt")
                                            : fmt::format("--prompt-file '{}'", prompt_file_));
  require_text(system_, "--system");
  return prompt;
}

// --raw: the text as typed, control-token texts included; otherwise the
// template's markers are the only control tokens and the messages plain text.
std::vector<Token> GenerateCommand::prompt_tokens(const Model& model,
                                                  const std::string& prompt) const {
  if (raw_) return model.tokenize(prompt, /*add_special=*/true);
  std::vector<ChatMessage> messages;
  if (!system_.empty()) messages.push_back({"system", system_});
  messages.push_back({"user", prompt});
  return chat_tokens(model, messages);
}

// The positions against --n-ctx and the model's training context, the
// context's memory by the runner's one check (require_memory).
void GenerateCommand::check_fits(const Model& model, const ContextOptions& context,
                                 size_t prompt_tokens) const {
  const uint64_t required = prompt_tokens + static_cast<uint64_t>(max_tokens_);
  if (required > context.n_ctx) {
    throw Error(
        ErrorCode::kBudget,
        fmt::format("prompt_tokens {} + max_tokens {} = {} > n_ctx {}; raise --n-ctx or shorten "
                    "the prompt",
                    prompt_tokens, max_tokens_, required, context.n_ctx));
  }
  if (const int32_t train = model.n_ctx_train();
      train > 0 && required > static_cast<uint64_t>(train)) {
    throw Error(
        ErrorCode::kBudget,
        fmt::format("prompt_tokens {} + max_tokens {} = {} > n_ctx_train {}, the context the "
                    "model was trained on; shorten the prompt or lower --max-tokens",
                    prompt_tokens, max_tokens_, required, train));
  }
  const ContextMemory need = estimate_context_memory(model, context);
  require_memory(need.total(), fmt::format("n_ctx {}", context.n_ctx),
                 fmt::format("KV {:.2f} GiB + attention scratch {:.2f} GiB",
                             need.kv_bytes / 1073741824.0, need.compute_bytes / 1073741824.0),
                 "lower --n-ctx");
}

int GenerateCommand::run() {
  ContextOptions context = context_;
  context.n_ubatch = context.n_batch;
  // Everything that needs no model is checked before it loads.
  validate_sampling(sampling_);
  validate_context_options(context);
  require_stop_strings(stop_);
  const Stopwatch run;
  const std::string prompt = read_prompt();
  const std::string model_path = resolve_model_path(model_);

  auto model = Model::load(model_path);
  GenerateTimings t;
  t.load_ms = run.ms();
  const std::vector<Token> tokens = prompt_tokens(*model, prompt);
  check_fits(*model, context, tokens.size());

  Context ctx(model, context);
  const Stopwatch prompt_time;
  ctx.decode_prompt(tokens, 0, 0, /*logits_last=*/true);
  t.prompt_ms = prompt_time.ms();

  Sampler sampler(*model, sampling_);
  const Stopwatch gen_time;
  GenerateOptions gen;
  gen.max_tokens = max_tokens_;
  gen.stop = stop_;
  const Generation answer = generate(ctx, sampler, 0, static_cast<Pos>(tokens.size()), gen);
  t.generate_ms = gen_time.ms();
  t.total_ms = run.ms();
  if (json_) {
    print_json(model_path, tokens.size(), answer, t, ctx.options());
  } else {
    print_text(model_path, tokens.size(), answer, t);
  }
  return 0;
}

}  // namespace swarmkv::cli
