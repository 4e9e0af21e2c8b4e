#include "worker_cmd.h"

#include <atomic>
#include <csignal>
#include <iostream>

#include <fmt/format.h>

#include "engine_flags.h"
#include "swarmkv/log.h"
#include "swarmkv/paths.h"

namespace swarmkv::cli {
namespace {

std::atomic<bool> g_stop{false};

extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

}  // namespace

WorkerCommand::WorkerCommand(CLI::App& app) {
  sub_ = app.add_subcommand(
      "worker",
      "Serve agent jobs from Redis: fetch the document's snapshot from the bus once (then keep "
      "it in the local snapshot store), run the agents of each job locally, post their results. "
      "Runs until SIGTERM or Ctrl-C, which finish and acknowledge the job in hand and exit 0. A "
      "job another worker left unfinished (it died) is taken over after --visibility-timeout. "
      "Redis going away is waited out, however long, reconnecting with backoff. Logs at info level "
      "unless --log-level says otherwise. See docs/cluster.md.");
  sub_->add_option("--redis", redis_,
                   "redis://[user:password@]host:port[/db], or for TLS rediss://... with "
                   "?cacert=FILE (the CAs the server's certificate must chain to; default: the "
                   "system's) and &cert=FILE&key=FILE (a client certificate) (default: "
                   "$SWARMKV_REDIS)");
  sub_->add_option("--cluster-key-file", cluster_key_file_,
                   "the cluster's shared secret (at least 16 bytes; default: the value of "
                   "$SWARMKV_CLUSTER_KEY): jobs, pipelines and snapshots not signed with it "
                   "(HMAC-SHA256) are refused and logged, never run; results, heartbeats and "
                   "snapshots are signed with it. Without one the worker runs any job, "
                   "unauthenticated (docs/cluster.md)");
  sub_->add_option("-m,--model", model_,
                   "GGUF model (default: see above); the worker serves the jobs of runs on the "
                   "same model file (by its SHA-256)");
  sub_->add_flag("--exact,!--no-exact", exact_,
                 "load the model with batch-invariant kernels (default on) and take the jobs "
                 "of exact runs; --no-exact: llama.cpp's stock kernels, the jobs of runs "
                 "--no-exact (docs/exact-mode.md)")
      ->capture_default_str();
  add_n_gpu_layers(sub_, n_gpu_layers_);
  sub_->add_option("--name", options_.name, "worker name in logs and results (default host-pid)");
  sub_->add_option("--max-agents", options_.max_agents,
                   "most agents of one job run at once; a larger job runs in slices (0 = all)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 16));
  sub_->add_option("-t,--threads", options_.n_threads, "CPU threads per context (0 = all cores)")
      ->capture_default_str();
  sub_->add_option("--visibility-timeout", options_.visibility_timeout_s,
                   "seconds a job may sit unrenewed on a worker before another takes it over")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  sub_->add_option("--heartbeat", options_.heartbeat_s,
                   "seconds between heartbeats (the worker is live for 5 of them)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  sub_->add_option("--cache-dir", options_.cache_dir,
                   "local snapshot store (default <cache>/snapshots)");
  sub_->add_option("--max-jobs", options_.max_jobs, "exit 0 after this many jobs (0 = never)")
      ->capture_default_str();
}

int WorkerCommand::run() {
  const redis::Url url = redis::resolve_url(redis_);
  cluster::WorkerOptions options = options_;
  options.cluster_key = cluster::ClusterKey::resolve(cluster_key_file_);
  validate_threads(options_.n_threads);
  // Before the model loads: a SIGTERM during the load is a drain too (exit 0).
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  const std::string model_path = resolve_model_path(model_);
  auto model = Model::load(model_path, ModelOptions{.n_gpu_layers = n_gpu_layers_.value_or(0),
                                                    .batch_invariant = exact_});
  options.stop = &g_stop;
  const cluster::WorkerReport r = cluster::run_worker(url, model, options);
  std::cerr << fmt::format(
      "swarmkv worker: {} job(s), {} agent(s), {} taken over from stalled workers, {} snapshot "
      "fetch(es)\n",
      r.jobs, r.agents, r.claimed_stale, r.fetches);
  return 0;
}

}  // namespace swarmkv::cli
