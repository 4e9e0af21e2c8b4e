// The peer: llama-server from the same llama.cpp build, driven over HTTP
// (cpp-httplib) with the same tokens, model, threads and greedy decoding, so
// `swarmkv bench` can compare against it in the same run.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "swarmkv/engine.h"

namespace swarmkv::cli {

// The llama-server to run: $SWARMKV_LLAMA_SERVER, else the one installed
// next to the llama.cpp SwarmKV was built against, else `llama-server` on
// PATH. Throws Error(kNotFound) naming the places it looked.
std::string find_llama_server(const std::string& explicit_path);

struct ServerConfig {
  std::string binary;
  std::string model;
  // threads (0: all cores), threads for batches, n_batch, n_ubatch, flash
  // attention, K/V types: the same as our arms'.
  ContextOptions engine;
  uint32_t n_ctx = 0;       // -c: KV cells in total (split per slot unless kv_unified)
  int32_t n_parallel = 1;   // -np: slots
  bool kv_unified = false;  // -kvu / -no-kvu
  std::string log_path;     // the server's stdout and stderr
};

// A llama-server child process listening on a loopback port it picked.
// The constructor returns once /health answers 200; the destructor always
// stops the server (SIGTERM, SIGKILL after 10 s) and reaps it. The child
// dies with this process (PR_SET_PDEATHSIG), so none is left behind even
// when the bench is killed.
class LlamaServer {
 public:
  // Throws Error(kIo) when the server cannot start or does not become
  // healthy within `ready_timeout`, with the tail of its log.
  explicit LlamaServer(const ServerConfig& config,
                       std::chrono::seconds ready_timeout = std::chrono::seconds(180));
  LlamaServer(const LlamaServer&) = delete;
  LlamaServer& operator=(const LlamaServer&) = delete;
  ~LlamaServer();

  void stop() noexcept;
  int port() const noexcept { return port_; }
  pid_t pid() const noexcept { return pid_; }
  long peak_rss_kib() const;  // the server's VmHWM, 0 once stopped
  const ServerConfig& config() const noexcept { return config_; }

 private:
  // Returns once /health answers 200. Throws Error(kIo) when the server
  // exits first or is not healthy within `ready_timeout` (then stopped),
  // with the tail of its log.
  void wait_until_healthy(std::chrono::seconds ready_timeout, const std::string& log_path);
  std::string log_tail() const;

  ServerConfig config_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// One /completion request: the prompt as token ids (no re-tokenisation),
// greedy, streamed so the first token's arrival is observed.
struct ServerReply {
  std::vector<Token> tokens;  // generated tokens (end-of-generation excluded)
  std::string text;
  double first_token_ms = 0;  // request sent -> first token received
  double total_ms = 0;        // request sent -> last byte received
  double done_at_ms = 0;      // completion, from the arm's start
  // The server's own timings.
  int64_t cache_n = 0;   // prompt tokens reused from its cache
  int64_t prompt_n = 0;  // prompt tokens it processed
  double prompt_ms = 0;
  int64_t predicted_n = 0;
  double predicted_ms = 0;
  std::string error;  // empty when ok
};

ServerReply server_complete(int port, const std::vector<Token>& prompt, int32_t n_predict,
                            std::chrono::steady_clock::time_point arm_start,
                            const std::atomic<bool>& interrupted);

}  // namespace swarmkv::cli
