#include "serve_cmd.h"

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <thread>

#include <pthread.h>

#include <fmt/format.h>

#include "engine_flags.h"
#include "swarmkv/error.h"
#include "swarmkv/host.h"
#include "swarmkv/log.h"
#include "swarmkv/paths.h"

namespace swarmkv::cli {

ServeCommand::ServeCommand(CLI::App& app) {
  sub_ = app.add_subcommand(
      "serve",
      "Serve an OpenAI-compatible API (POST /v1/chat/completions and /v1/completions, streaming "
      "too; GET /v1/models, "
      "/health, /metrics) on one model. Concurrent requests share one KV cache: each forks the "
      "longest token prefix already decoded (a document every agent sends is prefilled once) "
      "and all are decoded in the same batches. POST /v1/pipelines runs a pipeline sent as the "
      "JSON of a pipeline file (document.text, no model, no file) and streams its agents' "
      "events, then `run --json`'s result (?stream=false: the result alone); a browser sees the "
      "last runs at / and each at /runs/ID (graph, timeline and answers, live while it runs). "
      "Bound to 127.0.0.1 unless --host says otherwise. So that a web page cannot drive it "
      "or read its runs, every route but /health answers 403 to a Host that is not this "
      "server's name or address (DNS rebinding) and to an Origin of another site, POST "
      "routes 415 to a body that is not Content-Type application/json, and run ids are "
      "random. SIGTERM or Ctrl-C drain: requests in flight may finish for --drain seconds "
      "(then they fail: a stream ends with an error event and [DONE]) while /health answers 503 "
      "draining and new requests 503; then it exits 0. Logs at info level unless --log-level says "
      "otherwise. See docs/serve.md.");
  add_http_options();
  add_engine_options();
  add_limit_options();
  add_pipeline_options();
}

// Where it listens and whom it answers.
void ServeCommand::add_http_options() {
  sub_->add_option("--host", options_.host, "address to listen on")->capture_default_str();
  sub_->add_option("--port", options_.port, "TCP port (0: any free one, printed at start)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  sub_->add_option("-m,--model", model_, "GGUF model (default: see above)");
  sub_->add_option("--model-name", options_.model_name,
                   "the model id /v1/models lists and responses carry (default: the file name)");
  sub_->add_option("--api-key", options_.api_key,
                   "require 'Authorization: Bearer KEY' on every route but /health; a browser "
                   "is asked for it (any user name, KEY as the password) (default: "
                   "$SWARMKV_API_KEY; none: no auth, with a warning off loopback; an empty key "
                   "is an error)");
  sub_->add_option("--allow-host", options_.allow_hosts,
                   "a name a request's Host may carry besides localhost, this machine's name, "
                   "--host and the addresses the server is reached at (a reverse proxy's public "
                   "name); repeatable")
      ->allow_extra_args(false);
  sub_->add_option("--allow-origin", options_.allow_origins,
                   "a site (scheme://host[:port]) whose pages may use this server from a "
                   "browser besides its own; repeatable")
      ->allow_extra_args(false);
}

// The one context all requests share, and its kernels.
void ServeCommand::add_engine_options() {
  sub_->add_option("-c,--n-ctx", options_.context.n_ctx,
                   "KV cells of the one context all requests share")
      ->capture_default_str()
      ->check(CLI::Range(64u, 1u << 22));
  sub_->add_option("-b,--n-batch", options_.context.n_batch,
                   "most tokens per decode step (its micro-batch is 256 when that divides it, "
                   "as for `run`)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 16));
  sub_->add_option("-t,--threads", options_.context.n_threads,
                   "CPU threads (0 = all cores); posted pipelines run on them too, and one "
                   "asking for more threads is refused")
      ->capture_default_str();
  sub_->add_option("--flash-attn", flash_attn_,
                   "flash attention: on or off; exact mode (the default) needs it on")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
  add_n_gpu_layers(sub_, n_gpu_layers_);
  sub_->add_flag(
          "--exact,!--no-exact", options_.exact,
          "exact mode (default on): every completion's answer equals a re-prefill of its "
          "prompt bit for bit, however many requests share its batches, and posted "
          "pipelines are exact unless they say exact: false. Loads the model with "
          "batch-invariant kernels (of the repacked weight layouts only Q4_0's and IQ4_NL's, "
          "which are invariant) and turns flash attention on; "
          "when the KV cells are all handed out the cache starts over once the live "
          "completions have finished, cached prefixes included. Without our llama.cpp "
          "patches (or with GGML_CPU_FA_BATCH_INVARIANT=0) the server says so and runs "
          "without. --no-exact: llama.cpp's stock kernels, cells reused (docs/exact-mode.md)")
      ->capture_default_str();
}

// What one request, and all of them at once, may ask.
void ServeCommand::add_limit_options() {
  sub_->add_option("--max-live", options_.max_live,
                   "completions decoded at once (more wait in a queue)")
      ->capture_default_str()
      ->check(CLI::Range(1, 128));
  sub_->add_option("--max-cached", options_.max_cached,
                   "finished sequences kept for prefix reuse (least recently used evicted)")
      ->capture_default_str()
      ->check(CLI::Range(0, 128));
  sub_->add_option("--max-concurrent", options_.max_concurrent,
                   "HTTP requests in flight; more get 429 with Retry-After")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub_->add_option("--max-body", options_.max_body_bytes, "largest request body in bytes (413)")
      ->capture_default_str()
      ->check(CLI::Range(size_t{1}, size_t{1} << 30));
  sub_->add_option("--max-connections", options_.max_connections,
                   "HTTP connections open at once, each with a thread of its own; more are "
                   "answered 503 and closed")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  sub_->add_option("--max-connections-per-client", options_.max_connections_per_client,
                   "connections one client address may hold open; more from it are answered "
                   "503 and closed (0: a quarter of --max-connections; behind a reverse proxy, "
                   "where every request comes from one address, give --max-connections)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65536));
  sub_->add_option("--max-concurrent-per-client", options_.max_concurrent_per_client,
                   "requests one client address may have in flight; more get 429 (0: half of "
                   "--max-concurrent; behind a reverse proxy give --max-concurrent)")
      ->capture_default_str()
      ->check(CLI::Range(0, 4096));
  sub_->add_option("--header-timeout", options_.header_timeout_s,
                   "seconds a request's line and headers may take to arrive (from the "
                   "connection, or from a kept-alive connection's next byte); then 408 and the "
                   "connection closes, so slow clients cannot hold the server")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  sub_->add_option("--request-timeout", options_.request_timeout_s,
                   "seconds a whole request (line, headers, body) may take to arrive")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 86400.0));
  sub_->add_option("--max-tokens", options_.max_tokens, "the most max_tokens a request may ask")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  sub_->add_option("--default-max-tokens", options_.default_max_tokens,
                   "max_tokens of a request that gives none")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
}

// Posted pipelines, the snapshot store, the drain.
void ServeCommand::add_pipeline_options() {
  sub_->add_option("--max-pipelines", options_.max_pipelines,
                   "pipelines run at once, each in contexts of its own (more get 429; 0: no "
                   "/v1/pipelines)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  sub_->add_option("--keep-runs", options_.keep_runs,
                   "posted pipeline runs kept for / and /runs/ID (their answers, not their "
                   "documents); the oldest goes first")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  sub_->add_option("--max-pipeline-agents", options_.max_pipeline_agents,
                   "agents one posted pipeline may have (a corpus's reduce agents counted)")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub_->add_option("--max-pipeline-documents", options_.max_pipeline_documents,
                   "documents one posted corpus may have (`documents`: text items only, the "
                   "body within --max-body); they run one after another")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 16));
  sub_->add_option("--max-pipeline-ctx", options_.max_pipeline_ctx,
                   "KV cells a posted pipeline's context may have (its n_ctx, given or computed)")
      ->capture_default_str()
      ->check(CLI::Range(64u, 1u << 24));
  sub_->add_option("--snapshot-cache", snapshot_cache_,
                   "the snapshot store. Posted pipelines use it as `run --snapshot-cache` "
                   "does (on: restore the longest stored prefix of the document, publish what "
                   "was prefilled; read-only: never write). A chat prompt starting with a "
                   "stored prefix (same model and engine settings) restores it when the live "
                   "KV cache holds less of it (on or read-only; never written; not on "
                   "sliding-window models). off: neither")
      ->check(CLI::IsMember({"on", "off", "read-only"}))
      ->capture_default_str();
  sub_->add_option("--cache-dir", options_.snapshots.cache_dir,
                   "snapshot store (default <cache>/snapshots)");
  sub_->add_option_function<std::string>(
      "--posted-cache-max",
      [this](const std::string& size) { options_.posted_cache_max_bytes = parse_byte_size(size); },
      "bytes posted pipelines' snapshots may take, in a store of their own (<store>/posted, "
      "least recently used evicted), so that clients cannot evict the operator's entries; "
      "bytes or a number with K, M, G, T (default 1G)");
  sub_->add_option("--drain", options_.drain_s, "seconds requests in flight may take after SIGTERM")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
}

int ServeCommand::run() {
  ServerOptions options = options_;
  // An empty key would mean no auth at all: `--api-key "$KEY"` with KEY
  // unset must not turn it off.
  if (sub_->count("--api-key") > 0 && options.api_key.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                "--api-key is empty (an unset variable?): give a key, or leave --api-key out to "
                "serve without one");
  }
  if (options.api_key.empty()) {
    if (const char* key = std::getenv("SWARMKV_API_KEY"); key != nullptr) {
      if (*key == '\0') {
        throw Error(ErrorCode::kInvalidArgument,
                    "$SWARMKV_API_KEY is set but empty: give a key, or unset it to serve without "
                    "one");
      }
      options.api_key = key;
    }
  }
  if (options.api_key.empty() && !is_loopback_host(options.host)) {
    log_warn(
        "serve: listening on {} without --api-key: anyone who can reach this port can use the "
        "model and read every posted run",
        options.host);
  }
  if (sub_->count("--flash-attn") > 0) require_flash_attn_for_exact(flash_attn_, options.exact);
  options.snapshots.cache = parse_snapshot_cache_mode(snapshot_cache_);
  EngineSettings engine;
  engine.n_batch = options.context.n_batch;
  engine.n_threads = options.context.n_threads;
  engine.flash_attn = flash_attn_ == "on";
  engine.exact = options.exact;
  engine.n_gpu_layers = n_gpu_layers_.value_or(0);
  engine.validate();  // before the model loads
  // SIGTERM and SIGINT are taken by one thread (sigwait), blocked in all
  // others, which inherit this mask; a client gone mid-write is an error
  // return, not SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  const std::string model_path = resolve_model_path(model_);
  if (std::getenv("SWARMKV_LOG_LEVEL") == nullptr) set_log_level(LogLevel::kInfo);
  auto model = Model::load(model_path, engine.model_options());
  engine = engine.settle_exact(*model);  // off where Model::load said why
  if (engine.exact && !attention_batch_invariant()) {
    log_warn(
        "serve: exact mode is off: GGML_CPU_FA_BATCH_INVARIANT=0 turns off the "
        "batch-invariant attention kernel exact serving needs");
    engine.exact = false;
  }
  // The serving context's settings are derived as `run`'s are
  // (EngineSettings::context_options: micro-batch, threads, flash
  // attention, KV type, exact), so that a prompt's stored prefix has the
  // binding `run` gives it; after the load, which settles exact and the
  // attention kernel it reads.
  options.exact = engine.exact;
  const uint32_t n_ctx = options.context.n_ctx;
  options.context = engine.context_options();
  options.context.n_ctx = n_ctx;
  validate_context_options(options.context);
  Server server(model, options);
  std::cerr << fmt::format("swarmkv serve: http://{}:{}/v1 (model {}, {})\n", options.host,
                           server.port(), model_path, options.exact ? "exact" : "--no-exact")
            << std::flush;

  std::atomic<bool> done{false};
  std::thread signals([&] {
    const timespec tick{0, 200'000'000};
    while (!done.load()) {
      siginfo_t info;
      if (sigtimedwait(&stop_signals, &info, &tick) > 0) {
        log_info("serve: signal {}: draining (up to {} s)", info.si_signo, options.drain_s);
        server.stop();
        return;
      }
    }
  });
  server.run();
  done.store(true);
  signals.join();
  log_info("serve: stopped");
  return 0;
}

}  // namespace swarmkv::cli
