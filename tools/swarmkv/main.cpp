// swarmkv: the command-line front end of the SwarmKV library.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/paths.h"

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw swarmkv::Error(swarmkv::ErrorCode::kNotFound, "cannot open '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct GenerateArgs {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string system;
  bool raw = false;
  int32_t max_tokens = 128;
  swarmkv::SamplingOptions sampling;
  std::vector<std::string> stop;
  swarmkv::ContextOptions context;
  bool json = false;
};

int run_generate(const GenerateArgs& args) {
  const auto t_start = Clock::now();
  const std::string model_path = swarmkv::resolve_model_path(args.model);
  std::string prompt = args.prompt_file.empty() ? args.prompt : read_file(args.prompt_file);
  if (prompt.empty()) {
    throw swarmkv::Error(swarmkv::ErrorCode::kInvalidArgument,
                         "the prompt is empty (use --prompt or --prompt-file)");
  }

  auto model = swarmkv::Model::load(model_path);
  const double load_ms = ms_since(t_start);

  std::string text = prompt;
  if (!args.raw) {
    std::vector<swarmkv::ChatMessage> messages;
    if (!args.system.empty()) messages.push_back({"system", args.system});
    messages.push_back({"user", prompt});
    text = model->apply_chat_template(messages, /*add_assistant=*/true);
  }
  const std::vector<swarmkv::Token> tokens = model->tokenize(text, /*add_special=*/true);
  const uint64_t required = tokens.size() + static_cast<uint64_t>(args.max_tokens);
  if (required > args.context.n_ctx) {
    throw swarmkv::Error(
        swarmkv::ErrorCode::kBudget,
        fmt::format("prompt_tokens {} + max_tokens {} = {} > n_ctx {}; raise --n-ctx or shorten "
                    "the prompt",
                    tokens.size(), args.max_tokens, required, args.context.n_ctx));
  }

  swarmkv::Context ctx(model, args.context);
  const auto t_prompt = Clock::now();
  ctx.decode_prompt(tokens, 0, 0, /*logits_last=*/true);
  const double prompt_ms = ms_since(t_prompt);

  swarmkv::Sampler sampler(args.sampling);
  const auto t_gen = Clock::now();
  swarmkv::GenerateOptions gen;
  gen.max_tokens = args.max_tokens;
  gen.stop = args.stop;
  const swarmkv::Generation answer =
      swarmkv::generate(ctx, sampler, 0, static_cast<swarmkv::Pos>(tokens.size()), gen);
  const double gen_ms = ms_since(t_gen);
  const double total_ms = ms_since(t_start);

  if (args.json) {
    nlohmann::json out = {
        {"model", model_path},
        {"prompt_tokens", tokens.size()},
        {"n_tokens", answer.tokens.size()},
        {"answer", answer.text},
        {"stop_reason", std::string(swarmkv::to_string(answer.stop_reason))},
        {"timings_ms",
         {{"load", load_ms}, {"prompt", prompt_ms}, {"generate", gen_ms}, {"total", total_ms}}},
        {"n_ctx", ctx.options().n_ctx},
        {"n_threads", ctx.options().n_threads},
    };
    std::cout << out.dump(2) << "\n";
  } else {
    std::cout << answer.text << "\n";
    std::cerr << fmt::format(
        "\n[swarmkv] model {} | prompt {} tok in {:.1f} ms ({:.1f} tok/s) | answer {} tok in "
        "{:.1f} ms "
        "({:.1f} tok/s) | stop: {} | total {:.1f} ms\n",
        model_path, tokens.size(), prompt_ms,
        1000.0 * static_cast<double>(tokens.size()) / prompt_ms, answer.tokens.size(), gen_ms,
        gen_ms > 0 ? 1000.0 * static_cast<double>(answer.tokens.size()) / gen_ms : 0.0,
        swarmkv::to_string(answer.stop_reason), total_ms);
  }
  return 0;
}

int run_info(const std::string& model_arg) {
  const std::string model_path = swarmkv::resolve_model_path(model_arg);
  auto model = swarmkv::Model::load(model_path);
  nlohmann::json out = {
      {"model", model_path},
      {"description", model->description()},
      {"n_vocab", model->n_vocab()},
      {"n_layer", model->n_layer()},
      {"n_ctx_train", model->n_ctx_train()},
      {"size_bytes", model->size_bytes()},
      {"chat_template", model->has_chat_template()},
      {"engine", swarmkv::engine_build_info()},
      {"cache_dir", swarmkv::cache_dir()},
  };
  std::cout << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "SwarmKV: prefill a shared document once on llama.cpp, snapshot its KV state and fork every "
      "agent from "
      "it.\n\nModel: --model PATH, else $SWARMKV_MODEL, else the default SmolLM2-135M-Instruct in "
      "the cache "
      "($SWARMKV_CACHE, default ~/.cache/swarmkv; fetch it with scripts/fetch-model.sh).\nLogging: "
      "--log-level or "
      "$SWARMKV_LOG_LEVEL (debug|info|warn|error|off), always on stderr.",
      "swarmkv"};
  app.require_subcommand(1);
  std::string log_level = "";
  app.add_option("--log-level", log_level, "debug, info, warn (default), error or off");

  GenerateArgs gen;
  CLI::App* generate = app.add_subcommand(
      "generate",
      "Generate one answer to one prompt (chat template applied) and print it with its timings");
  generate->add_option("-m,--model", gen.model, "GGUF model file (default: see above)");
  auto* prompt_opt = generate->add_option("-p,--prompt", gen.prompt, "the user message");
  generate->add_option("-f,--prompt-file", gen.prompt_file, "read the user message from a file")
      ->excludes(prompt_opt)
      ->check(CLI::ExistingFile);
  generate->add_option("--system", gen.system, "a system message placed before the prompt");
  generate->add_flag("--raw", gen.raw, "send the prompt as is, without the model's chat template");
  generate->add_option("-n,--max-tokens", gen.max_tokens, "most tokens to generate")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  generate->add_option("--temp", gen.sampling.temperature, "sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::Range(0.0f, 100.0f));
  generate->add_option("--top-p", gen.sampling.top_p, "nucleus sampling mass (1 = off)")
      ->capture_default_str();
  generate->add_option("--top-k", gen.sampling.top_k, "keep the k most likely tokens (0 = off)")
      ->capture_default_str();
  generate->add_option("--seed", gen.sampling.seed, "RNG seed for sampled generation")
      ->capture_default_str();
  generate->add_option("--stop", gen.stop,
                       "stop when the answer ends with this string (repeatable)");
  generate->add_option("-c,--n-ctx", gen.context.n_ctx, "context size in tokens")
      ->capture_default_str()
      ->check(CLI::Range(16u, 1u << 22));
  generate->add_option("-b,--n-batch", gen.context.n_batch, "most tokens per decode call")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  generate->add_option("-t,--threads", gen.context.n_threads, "CPU threads (0 = all cores)")
      ->capture_default_str();
  generate->add_flag("--json", gen.json, "print one JSON object instead of text");

  std::string info_model;
  CLI::App* info =
      app.add_subcommand("info", "Print the model's metadata and the llama.cpp build as JSON");
  info->add_option("-m,--model", info_model, "GGUF model file (default: see above)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (!log_level.empty()) swarmkv::set_log_level(swarmkv::parse_log_level(log_level));
    gen.context.n_ubatch = gen.context.n_batch;
    if (*generate) return run_generate(gen);
    if (*info) return run_info(info_model);
  } catch (const swarmkv::Error& e) {
    std::cerr << "swarmkv: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "swarmkv: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
