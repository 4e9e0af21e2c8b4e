// `swarmkv serve`: an OpenAI-compatible HTTP server on one model whose
// concurrent requests share one KV cache. Each request is forked from the
// longest token prefix already decoded (src/server/completion_engine.h), so
// agents that send the same long document prefill it once.
//
// Routes: POST /v1/chat/completions (with "stream": true as server-sent
// events), POST /v1/pipelines (a pipeline file's JSON, run on the server's
// model: its agents' events, then `swarmkv run --json`'s result;
// src/server/pipeline_runner.h), GET /v1/pipelines/<id> (a run's result so
// far), GET / and GET /runs/<id> (the runs as pages, run_page.h), GET
// /v1/models, GET /health (no key needed), GET /metrics (Prometheus text).
// The key goes as a Bearer token, or as the password of Basic auth (what a
// browser sends). A request must name this server as its Host, come from
// no other site (Origin), and POST JSON (src/server/request_guard.h).
// Errors are OpenAI's error JSON; docs/serve.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "swarmkv/engine.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0: any free port (Server::port() tells which)
  std::string api_key;  // non-empty: every route but /health needs "Bearer <key>" (or Basic auth
                        // with the key as the password)
  // Every route but /health answers only a Host that names this server
  // (localhost, this machine's name, `host`, an address it was reached at
  // or a loopback one) and an Origin, when a browser sends one, that is
  // its own: a web page cannot drive it, nor read its runs through DNS
  // rebinding (403). More names a Host may carry (a reverse proxy's) and
  // more origins ("https://app.example:8443") a page may come from:
  std::vector<std::string> allow_hosts;
  std::vector<std::string> allow_origins;
  // The id /v1/models lists (with the alias "swarmkv") and a request may
  // name; empty: the model file's name.
  std::string model_name;
  ContextOptions context{.n_ctx = 8192};  // the one context all requests share
  int32_t max_live = 16;                  // completions decoding at once
  int32_t max_cached = 16;                // finished sequences kept for prefix reuse
  int32_t max_concurrent = 64;            // requests in flight; more get 429 with Retry-After
  size_t max_body_bytes = 8u << 20;       // larger bodies get 413
  // Connections: each holds a thread of its own; more than max_connections
  // are answered 503 and closed. A request's line and headers must arrive
  // within header_timeout_s (else 408), all of it within request_timeout_s.
  int32_t max_connections = 256;
  // One client address's share, so that one client cannot take all of
  // them: connections open at once (more from it get 503) and requests in
  // flight (more get 429). 0: a quarter of max_connections and half of
  // max_concurrent (at least 1). Behind a reverse proxy every request
  // comes from the proxy's address: set them to the totals.
  int32_t max_connections_per_client = 0;
  int32_t max_concurrent_per_client = 0;
  double header_timeout_s = 10;
  double request_timeout_s = 60;
  int32_t max_messages = 256;
  int32_t max_tokens = 4096;  // the most max_tokens a request may ask for
  // When a request gives none (capped by the context): a few seconds of a
  // small model's decoding, not minutes.
  int32_t default_max_tokens = 256;
  int32_t max_n = 8;    // completions per request
  double drain_s = 30;  // stop(): seconds in-flight requests may still take
  // POST /v1/pipelines: runs at once (each with contexts of its own beside
  // the shared one; more get 429; 0: no such route), agents per pipeline
  // (a corpus's reduce agents counted), documents per corpus, and the KV
  // cells a pipeline's context may have.
  int32_t max_pipelines = 1;
  int32_t max_pipeline_agents = 64;
  int32_t max_pipeline_documents = 64;
  uint32_t max_pipeline_ctx = 32768;
  // The posted runs GET / lists and GET /runs/<id> (a page) and GET
  // /v1/pipelines/<id> (its result so far) show: the last keep_runs, each
  // kept with its answers, not its document.
  int32_t keep_runs = 32;
  // The snapshot store (cache, cache_dir, cache_max_bytes; `file` must stay
  // empty). A posted pipeline's document prefix is looked up and published
  // as `swarmkv run` does, in its own store (below); a chat prompt restores the longest stored
  // prefix it starts with (kOn or kReadOnly; never written, and not on models with sliding-window
  // layers: src/server/completion_engine.h). Off by default here; the CLI turns it on.
  SnapshotOptions snapshots;
  // Posted pipelines keep their documents' snapshots in a store of their
  // own, <store>/posted, capped at this many bytes (LRU), so that clients
  // cannot evict (or probe) the operator's entries. 0: 1 GiB.
  uint64_t posted_cache_max_bytes = 0;
  // Exact mode (docs/exact-mode.md): every completion's answer equals a
  // re-prefill of its prompt bit for bit, however many share its batches,
  // and posted pipelines are exact unless they say exact: false. Needs the
  // model loaded with ModelOptions::batch_invariant and our attention
  // kernel (the Server refuses otherwise; `swarmkv serve` turns exact off
  // with a warning where they are missing); flash attention is on. The
  // cache starts over when its cells are all handed out, once the live
  // completions have finished (src/server/completion_engine.h).
  bool exact = true;
};

// Thread-safe: stop() from any thread (not from a signal handler).
class Server {
 public:
  // Creates the shared context and binds host:port. Throws Error: kIo when
  // the address cannot be bound (in use, no such host), kInvalidArgument for
  // inconsistent options, what Context throws.
  Server(std::shared_ptr<const Model> model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound port.
  int port() const noexcept;
  // Serves until stop(); returns once every request has been answered or
  // failed (after the drain deadline, with kAborted "the server is shutting
  // down").
  void run();
  // Drains: the listener stays up, answering /health with 503 "draining"
  // and new completions and pipelines with 503; requests in flight may
  // finish for drain_s seconds, then fail with kAborted (a stream with an
  // error event and [DONE]); then the listener closes and run() returns.
  // Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace swarmkv
