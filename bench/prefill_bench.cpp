// swarmkv_prefill_bench: prefill time of one document against n_batch, at
// given engine settings (flash attention, KV type, micro-batch, threads).
//
// All n_batch values are measured in one run; their order alternates between
// trials so drift does not favour one. One untimed warm-up decode comes
// first, as llama-bench does its own. Prints (or writes) one JSON object.
// bench/prefill_settings.py runs it next to llama-bench at equal settings.
#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/synthetic.h"

namespace {

// The seed's synthetic document: BOS + exactly n - 1 checked text tokens.
std::vector<swarmkv::Token> synthetic_tokens(const swarmkv::Model& model, size_t n) {
  const auto text_tokens = static_cast<int32_t>(n > 1 ? n - 1 : 1);
  return model.tokenize(swarmkv::synthetic_document(model, text_tokens), true);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2.0;
}

// The command line: the document, the n_batch values and the engine settings.
struct Args {
  std::string model_arg, doc_file, out_file;
  size_t doc_tokens = 3501;
  std::vector<uint32_t> n_batches = {64, 256, 512, 1024};
  int trials = 3;
  int threads = 0;
  std::string flash_attn = "off";
  std::string kv_type = "f16";
  uint32_t n_ubatch = 0;
};

void add_options(CLI::App& app, Args& a) {
  app.add_option("-m,--model", a.model_arg,
                 "GGUF model (default: $SWARMKV_MODEL or the cached default)");
  auto* doc_opt = app.add_option("--doc", a.doc_file, "document file (default: synthetic)")
                      ->check(CLI::ExistingFile);
  app.add_option("--doc-tokens", a.doc_tokens, "synthetic document length in tokens")
      ->excludes(doc_opt)
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  app.add_option("--n-batch", a.n_batches, "n_batch values to compare")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--trials", a.trials, "trials per n_batch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  app.add_option("-t,--threads", a.threads, "CPU threads (0 = all cores)")->capture_default_str();
  app.add_option("--flash-attn", a.flash_attn, "flash attention")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  app.add_option("--kv-type", a.kv_type, "K and V cache type")
      ->check(CLI::IsMember({"f16", "q8_0"}))
      ->capture_default_str();
  app.add_option("--n-ubatch", a.n_ubatch, "micro-batch (0 = each n_batch)")->capture_default_str();
  app.add_option("-o,--out", a.out_file, "write the JSON here instead of stdout");
}

swarmkv::ContextOptions options_for(const Args& a, size_t n_tokens, uint32_t n_batch) {
  swarmkv::ContextOptions o;
  o.n_ctx = static_cast<uint32_t>(n_tokens + 16);
  o.n_batch = n_batch;
  o.n_ubatch = a.n_ubatch > 0 ? std::min(a.n_ubatch, n_batch) : n_batch;
  o.n_threads = a.threads;
  o.flash_attn = a.flash_attn == "on";
  o.type_k = o.type_v = swarmkv::parse_kv_type(a.kv_type);
  return o;
}

// Per n_batch value: each trial's prefill ms, and the last trial's top token.
struct Measured {
  std::vector<std::vector<double>> ms;
  std::vector<swarmkv::Token> top1;
};

// One untimed warm-up decode, then every n_batch value per trial, the order
// reversed on every other trial.
Measured measure(const std::shared_ptr<const swarmkv::Model>& model,
                 const std::vector<swarmkv::Token>& tokens, const Args& a) {
  {
    swarmkv::Context warm(model, options_for(a, tokens.size(), a.n_batches[0]));
    const size_t n = std::min<size_t>(tokens.size(), warm.options().n_ubatch);
    warm.decode_prompt(std::span(tokens).first(n), 0, 0);
  }
  Measured m{std::vector<std::vector<double>>(a.n_batches.size()),
             std::vector<swarmkv::Token>(a.n_batches.size(), -1)};
  for (int t = 0; t < a.trials; ++t) {
    for (size_t k = 0; k < a.n_batches.size(); ++k) {
      const size_t i = (t % 2 == 0) ? k : a.n_batches.size() - 1 - k;
      swarmkv::Context ctx(model, options_for(a, tokens.size(), a.n_batches[i]));
      const auto start = std::chrono::steady_clock::now();
      ctx.decode_prompt(tokens, 0, 0);
      m.ms[i].push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count());
      const auto logits = ctx.logits(-1);
      m.top1[i] = static_cast<swarmkv::Token>(std::max_element(logits.begin(), logits.end()) -
                                              logits.begin());
      std::cerr << "trial " << t + 1 << "/" << a.trials << " n_batch " << a.n_batches[i] << ": "
                << m.ms[i].back() << " ms\n";
    }
  }
  return m;
}

nlohmann::json to_json(const Args& a, const std::string& model_path, size_t n_tokens,
                       const Measured& m) {
  nlohmann::json results = nlohmann::json::array();
  for (size_t i = 0; i < a.n_batches.size(); ++i) {
    const double med = median(m.ms[i]);
    results.push_back({{"n_batch", a.n_batches[i]},
                       {"prefill_ms", m.ms[i]},
                       {"median_ms", med},
                       {"tokens_per_s", 1000.0 * static_cast<double>(n_tokens) / med},
                       {"top1_matches_first", m.top1[i] == m.top1[0]}});
  }
  return {
      {"params",
       {{"model", model_path},
        {"doc", a.doc_file.empty() ? "synthetic" : a.doc_file},
        {"doc_tokens", n_tokens},
        {"n_batch", a.n_batches},
        {"trials", a.trials},
        {"threads", a.threads},
        {"flash_attn", a.flash_attn == "on"},
        {"kv_type", a.kv_type},
        {"n_ubatch", a.n_ubatch}}},
      {"environment", {{"engine", swarmkv::engine_build_info()}}},
      {"results", results},
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Measures prefill time of one document for several n_batch values, in one run."};
  Args a;
  add_options(app, a);
  CLI11_PARSE(app, argc, argv);

  try {
    const std::string model_path = swarmkv::resolve_model_path(a.model_arg);
    auto model = swarmkv::Model::load(model_path);
    const std::vector<swarmkv::Token> tokens =
        a.doc_file.empty() ? synthetic_tokens(*model, a.doc_tokens)
                           : model->tokenize(swarmkv::read_file(a.doc_file), true);
    const nlohmann::json out = to_json(a, model_path, tokens.size(), measure(model, tokens, a));
    if (a.out_file.empty()) {
      std::cout << out.dump(2) << "\n";
    } else {
      std::ofstream(a.out_file) << out.dump(2) << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << "swarmkv_prefill_bench: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
