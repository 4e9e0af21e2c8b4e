#include "server_arm.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "swarmkv/error.h"
#include "swarmkv/measure.h"

#ifndef SWARMKV_LLAMA_SERVER_DEFAULT
#define SWARMKV_LLAMA_SERVER_DEFAULT ""
#endif

namespace swarmkv::cli {
namespace {

using nlohmann::json;

// A free loopback port: bind port 0, read what the kernel chose, release it.
int pick_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw Error(ErrorCode::kIo, "cannot open a socket to pick a port");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  ::close(fd);
  if (!ok) throw Error(ErrorCode::kIo, "cannot bind a loopback socket to pick a port");
  return ntohs(addr.sin_port);
}

bool is_executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0 &&
         std::filesystem::is_regular_file(path);
}

// llama-server's command line: our arms' engine settings in its flags.
std::vector<std::string> server_args(const ServerConfig& config, int port) {
  const ContextOptions& e = config.engine;
  const int32_t threads = effective_threads(e.n_threads);
  const int32_t threads_batch =
      e.n_threads_batch > 0 ? effective_threads(e.n_threads_batch) : threads;
  return {config.binary,
          "--model",
          config.model,
          "--host",
          "127.0.0.1",
          "--port",
          std::to_string(port),
          "--ctx-size",
          std::to_string(config.n_ctx),
          "--parallel",
          std::to_string(config.n_parallel),
          config.kv_unified ? "--kv-unified" : "--no-kv-unified",
          "--threads",
          std::to_string(threads),
          "--threads-batch",
          std::to_string(threads_batch),
          "--batch-size",
          std::to_string(e.n_batch),
          "--ubatch-size",
          std::to_string(std::min(e.n_ubatch, e.n_batch)),
          "--flash-attn",
          e.flash_attn ? "on" : "off",
          "--cache-type-k",
          std::string(to_string(e.type_k)),
          "--cache-type-v",
          std::string(to_string(e.type_v)),
          "--cache-prompt",
          "--no-webui",
          "--no-warmup"};
}

}  // namespace

std::string find_llama_server(const std::string& explicit_path) {
  std::vector<std::string> tried;
  auto consider = [&](const std::string& p) {
    if (p.empty()) return false;
    tried.push_back(p);
    return is_executable(p);
  };
  if (!explicit_path.empty()) {
    if (consider(explicit_path)) return explicit_path;
    throw Error(
        ErrorCode::kNotFound,
        fmt::format("llama-server '{}' does not exist or is not executable", explicit_path));
  }
  if (const char* env = std::getenv("SWARMKV_LLAMA_SERVER"); env != nullptr && consider(env))
    return env;
  if (consider(SWARMKV_LLAMA_SERVER_DEFAULT)) return SWARMKV_LLAMA_SERVER_DEFAULT;
  if (const char* path = std::getenv("PATH")) {
    std::stringstream dirs(path);
    for (std::string dir; std::getline(dirs, dir, ':');) {
      if (!dir.empty() && consider(dir + "/llama-server")) return dir + "/llama-server";
    }
  }
  throw Error(ErrorCode::kNotFound,
              fmt::format("llama-server not found (looked at $SWARMKV_LLAMA_SERVER, the build's "
                          "llama.cpp install and PATH: {}); scripts/build-llama.sh builds it",
                          tried.empty() ? std::string("nothing")
                                        : fmt::format("{}", fmt::join(tried, ", "))));
}

LlamaServer::LlamaServer(const ServerConfig& config, std::chrono::seconds ready_timeout)
    : config_(config), port_(pick_port()) {
  std::vector<std::string> args = server_args(config, port_);
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log_path = config.log_path.empty() ? "/dev/null" : config.log_path;
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) throw Error(ErrorCode::kIo, fmt::format("cannot open '{}'", log_path));
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ == 0) {
    // Child: only async-signal-safe calls until exec.
    ::setpgid(0, 0);                     // Ctrl-C in the terminal is the bench's to handle
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the bench
    if (::getppid() != parent) ::_exit(127);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  ::close(log_fd);
  if (pid_ < 0) throw Error(ErrorCode::kIo, "fork failed while starting llama-server");

  wait_until_healthy(ready_timeout, log_path);
}

void LlamaServer::wait_until_healthy(std::chrono::seconds ready_timeout,
                                     const std::string& log_path) {
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(std::chrono::seconds(1));
  const auto deadline = Clock::now() + ready_timeout;
  for (;;) {
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw Error(ErrorCode::kIo,
                  fmt::format("llama-server exited during start-up ({}); its log ({}):\n{}",
                              WIFEXITED(status) ? fmt::format("status {}", WEXITSTATUS(status))
                                                : fmt::format("signal {}", WTERMSIG(status)),
                              log_path, log_tail()));
    }
    if (auto res = client.Get("/health"); res && res->status == 200) break;
    if (Clock::now() > deadline) {
      const std::string tail = log_tail();
      stop();
      throw Error(ErrorCode::kIo,
                  fmt::format("llama-server did not become healthy within {} s; its log ({}):\n{}",
                              ready_timeout.count(), log_path, tail));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

LlamaServer::~LlamaServer() {
  stop();
}

void LlamaServer::stop() noexcept {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (::waitpid(pid_, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  pid_ = -1;
}

long LlamaServer::peak_rss_kib() const {
  return pid_ > 0 ? swarmkv::peak_rss_kib(pid_) : 0;
}

std::string LlamaServer::log_tail() const {
  std::ifstream in(config_.log_path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(line);
    if (lines.size() > 20) lines.erase(lines.begin());
  }
  std::string out;
  for (const std::string& l : lines) out += "  " + l + "\n";
  return out.empty() ? "  (empty)\n" : out;
}

ServerReply server_complete(int port, const std::vector<Token>& prompt, int32_t n_predict,
                            Clock::time_point arm_start, const std::atomic<bool>& interrupted) {
  ServerReply reply;
  const json body = {{"prompt", prompt},     {"n_predict", n_predict}, {"temperature", 0.0},
                     {"top_k", 1},           {"cache_prompt", true},   {"stream", true},
                     {"return_tokens", true}};
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(std::chrono::hours(1));
  httplib::Request req;
  req.method = "POST";
  req.path = "/completion";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  std::string buffer;
  json final_event;
  const auto sent = Clock::now();
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buffer.append(data, len);
    // Server-sent events: "data: {...}\n\n".
    for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
      const std::string event = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      const json j = json::parse(event.substr(6), nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;
      if (j.contains("tokens") && j["tokens"].is_array()) {
        if (reply.tokens.empty() && !j["tokens"].empty())
          reply.first_token_ms = ms_between(sent, Clock::now());
        for (const auto& t : j["tokens"]) reply.tokens.push_back(t.get<Token>());
      }
      if (j.contains("content") && j["content"].is_string())
        reply.text += j["content"].get<std::string>();
      if (j.value("stop", false)) final_event = j;
    }
    return !interrupted.load();
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool ok = client.send(req, res, err);
  const auto done = Clock::now();
  reply.total_ms = ms_between(sent, done);
  reply.done_at_ms = ms_between(arm_start, done);
  if (!ok) {
    reply.error = fmt::format("HTTP request failed: {}", httplib::to_string(err));
  } else if (res.status != 200) {
    reply.error = fmt::format("HTTP {}: {}", res.status, buffer.substr(0, 300));
  } else if (final_event.is_null()) {
    reply.error = "the stream ended without a final event";
  }
  if (final_event.contains("timings")) {
    const json& t = final_event["timings"];
    reply.cache_n = t.value("cache_n", int64_t{0});
    reply.prompt_n = t.value("prompt_n", int64_t{0});
    reply.prompt_ms = t.value("prompt_ms", 0.0);
    reply.predicted_n = t.value("predicted_n", int64_t{0});
    reply.predicted_ms = t.value("predicted_ms", 0.0);
  }
  return reply;
}

}  // namespace swarmkv::cli
