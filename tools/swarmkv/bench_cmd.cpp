#include "bench_cmd.h"

namespace swarmkv::cli {

BenchCommand::BenchCommand(CLI::App& app) {
  sub_ = app.add_subcommand("bench",
                            "Benchmark the reference arm none (every branch re-prefills the "
                            "document in its own context) against SwarmKV's forks "
                            "(host: prefill once, copy + restore a host snapshot per branch; "
                            "shared: one unified-KV context, seq_cp fork, batched decode), "
                            "all arms in one run, alternating their order "
                            "between trials. Writes best_run.json and all_trials.csv to "
                            "--out; bench/plot_bench.py OUT then draws the plots and "
                            "writes report.md. Ctrl-C keeps the trials finished so far.");
  add_workload_options();
  add_trial_options();
}

// What one trial measures: the model, the document, the branches, the engine.
void BenchCommand::add_workload_options() {
  sub_->add_option("-m,--model", args_.model, "GGUF model (default: see above)");
  auto* doc_opt = sub_->add_option("--doc", args_.doc_file, "document file (default: synthetic)")
                      ->check(CLI::ExistingFile);
  sub_->add_option("--doc-tokens", args_.doc_tokens,
                   "synthetic document: 'The quick brown fox jumps over the lazy dog.' cut to "
                   "exactly N tokens")
      ->excludes(doc_opt)
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub_->add_option("--branches", args_.branches, "branches (agents)")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub_->add_option("--branch-tokens", args_.branch_tokens, "tokens of each branch's own question")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub_->add_option("--n-predict", args_.n_predict, "greedy tokens generated per branch")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub_->add_option("--n-ctx", args_.n_ctx,
                   "KV cells per context, every arm (default: per arm, the smallest multiple of "
                   "256 that fits its layout)");
  sub_->add_option("-t,--threads", args_.threads, "CPU threads per context (0 = all cores)")
      ->capture_default_str();
  sub_->add_option("--max-live", args_.max_live,
                   "the shared arm's branches decoded at once, at most (pipeline key max_live; 0 "
                   "= all that fit)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  args_.engine.add_to(sub_);
}

// How often and on which arms, and where the results go.
void BenchCommand::add_trial_options() {
  sub_->add_option("--trials", args_.trials, "trials")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000));
  sub_->add_option("--pause-ms", args_.pause_ms, "idle pause between trials")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  sub_->add_option(
          "--arms", args_.arms,
          "arms: none,host,shared,server-concurrent,server-sequential; none, the reference the "
          "others' answers and speed-ups are compared with, first (without it nothing is "
          "compared) (server-*: llama-server from the same llama.cpp, same tokens, greedy, over "
          "HTTP)")
      ->delimiter(',')
      ->capture_default_str();
  sub_->add_option("--sweep", args_.sweep,
                   "branches=1,2,4,8,16 or doc-tokens=512,1024,2048,3501,7000");
  sub_->add_option("-o,--out", args_.out, "output directory")->capture_default_str();
  sub_->add_option("--server-bin", args_.server_bin,
                   "llama-server for the server-* arms (default: $SWARMKV_LLAMA_SERVER, else the "
                   "one installed with the llama.cpp SwarmKV was built against, else PATH)");
  sub_->add_option("--server-kvu", args_.server_kvu,
                   "server-concurrent's KV layout: on (-kvu), off (-no-kvu), or both: measure "
                   "both on the first trial of each point and keep the faster")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
}

}  // namespace swarmkv::cli
