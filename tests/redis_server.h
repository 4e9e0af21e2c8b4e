// A redis-server of the test's own on a free loopback port, persistence
// off; killed with the test process (PR_SET_PDEATHSIG) if the test dies.
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace swarmkv::testing {

inline int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("no free loopback port");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

// Whether something accepts TCP connections on 127.0.0.1:port.
inline bool port_open(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The certificates tests/make_test_certificates.sh makes in `dir`: a test
// CA's for 127.0.0.1 (server), a client's, and another CA's for 127.0.0.1
// (stranger).
struct TestCertificates {
  std::string ca, server_cert, server_key, client_cert, client_key, stranger_cert, stranger_key;

  explicit TestCertificates(const std::filesystem::path& dir) {
    const std::string d = dir.string();
    std::filesystem::create_directories(dir);
    if (std::system(fmt::format("bash '{}' '{}' >'{}/openssl.log' 2>&1",
                                SWARMKV_TEST_CERTIFICATES_SCRIPT, d, d)
                        .c_str()) != 0) {
      throw std::runtime_error("openssl could not make the test certificates (see " + d +
                               "/openssl.log)");
    }
    ca = d + "/test-ca.pem";
    server_cert = d + "/server.pem";
    server_key = d + "/server.key";
    client_cert = d + "/client.pem";
    client_key = d + "/client.key";
    stranger_cert = d + "/stranger.pem";
    stranger_key = d + "/stranger.key";
  }
};

class RedisServer {
 public:
  // `extra`: more redis-server arguments, e.g. {"--requirepass", "pw"}.
  explicit RedisServer(std::vector<std::string> extra = {}, int port = 0)
      : port_(port > 0 ? port : free_loopback_port()), extra_(std::move(extra)) {
    start();
  }
  // TLS only (no plain port), with this certificate and key; clients'
  // certificates are checked against `ca` when `auth_clients` is "yes"
  // ("optional": when they give one; "no": never).
  static RedisServer tls_only(const std::string& cert, const std::string& key,
                              const std::string& ca, const std::string& auth_clients,
                              std::vector<std::string> extra = {}) {
    std::vector<std::string> args{"--port",
                                  "0",
                                  "--tls-cert-file",
                                  cert,
                                  "--tls-key-file",
                                  key,
                                  "--tls-ca-cert-file",
                                  ca,
                                  "--tls-auth-clients",
                                  auth_clients};
    args.insert(args.end(), extra.begin(), extra.end());
    return RedisServer(std::move(args), 0, true);
  }
  RedisServer(RedisServer&& other) noexcept
      : port_(other.port_), extra_(std::move(other.extra_)), tls_(other.tls_), pid_(other.pid_) {
    other.pid_ = -1;
  }
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  int port() const { return port_; }
  std::string url(const std::string& userinfo = "") const {
    return fmt::format("{}://{}127.0.0.1:{}", tls_ ? "rediss" : "redis",
                       userinfo.empty() ? "" : userinfo + "@", port_);
  }

  void start() {
    std::vector<std::string> args{SWARMKV_REDIS_SERVER,
                                  tls_ ? "--tls-port" : "--port",
                                  std::to_string(port_),
                                  "--bind",
                                  "127.0.0.1",
                                  "--save",
                                  "",
                                  "--appendonly",
                                  "no",
                                  "--loglevel",
                                  "warning"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!port_open(port_)) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error(fmt::format("redis-server exited at start (port {})", port_));
      }
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("redis-server did not listen within 10 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Stops it (SIGKILL: no chance to save anything, as in a crash).
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    while (port_open(port_)) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

 private:
  RedisServer(std::vector<std::string> extra, int port, bool tls)
      : port_(port > 0 ? port : free_loopback_port()), extra_(std::move(extra)), tls_(tls) {
    start();
  }

  int port_;
  std::vector<std::string> extra_;
  bool tls_ = false;
  pid_t pid_ = -1;
};

}  // namespace swarmkv::testing
