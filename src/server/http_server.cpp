#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "swarmkv/log.h"

namespace swarmkv::server {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// A head larger than this is handed to httplib as it is, which refuses it
// (its line limit is 8 KiB).
constexpr size_t kMaxHeadBytes = 64 * 1024;
// How often a connection waiting for bytes looks whether the server stopped.
constexpr auto kStopPoll = std::chrono::milliseconds(100);

// A thread per connection; finished ones are joined at the next connection
// and the rest at shutdown.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  ~ConnectionThreads() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    reap_locked();
    const uint64_t id = next_id_++;
    auto task = std::make_shared<std::function<void()>>(std::move(fn));
    try {
      threads_.emplace(id, std::thread([this, id, task] {
                         (*task)();
                         std::lock_guard done_lock(mutex_);
                         done_.push_back(id);
                       }));
    } catch (const std::system_error& e) {
      // No thread to be had: the connection is served here, on the accept
      // thread (over max_connections that is one 503).
      log_warn("serve: no thread for a connection ({}); serving it on the accept thread", e.what());
      (*task)();
    }
  }

  void shutdown() override {
    std::map<uint64_t, std::thread> running;
    {
      std::lock_guard lock(mutex_);
      running.swap(threads_);
      done_.clear();
    }
    for (auto& [id, thread] : running) thread.join();
  }

 private:
  void reap_locked() {
    for (const uint64_t id : done_) {
      const auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      it->second.join();
      threads_.erase(it);
    }
    done_.clear();
  }

  std::mutex mutex_;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> done_;
  uint64_t next_id_ = 0;
};

// The address and port of one end of a connected socket ("" and 0 when
// it cannot be had).
void address_of(int (*get)(int, sockaddr*, socklen_t*), socket_t sock, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ip.clear();
  port = 0;
  if (get(sock, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text);
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof text);
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

// The connection whose request this thread is answering (client_gone).
thread_local socket_t current_connection = INVALID_SOCKET;

// Connections over max_connections that may wait at once for their head,
// to see whether it is a GET /health (answered even at the cap), and how
// long one may wait; the rest are answered 503 at once.
constexpr int32_t kMaxHealthChecksOverCap = 16;
constexpr double kHealthCheckHeadS = 1.0;

// httplib's Stream over one connection, reading through a buffer that
// await_head fills with the request's head under its deadline.
class ConnectionStream final : public httplib::Stream {
 public:
  enum class Head { kReady, kClosed, kTimedOut };

  ConnectionStream(socket_t sock, const ConnectionLimits& limits,
                   const std::atomic<socket_t>& listener)
      : sock_(sock), limits_(limits), listener_(listener) {}

  // Waits for a request: its first byte until `first_byte_by`, its whole
  // head until `head_by` (or header_timeout_s from the first byte when
  // unset). kClosed: the client closed, sent nothing in time, or the server
  // stopped; kTimedOut: part of a head came, not all of it.
  Head await_head(Clock::time_point first_byte_by, std::optional<Clock::time_point> head_by) {
    request_by_.reset();
    while (buffered() == 0) {
      if (const auto got = fill(first_byte_by); got <= 0) return Head::kClosed;
    }
    const auto now = Clock::now();
    const Clock::time_point deadline = head_by.value_or(now + seconds(limits_.header_timeout_s));
    size_t searched = pos_;
    while (true) {
      const std::string_view unread(buf_.data() + pos_, buf_.size() - pos_);
      const size_t from = searched - pos_ >= 3 ? searched - pos_ - 3 : 0;
      if (unread.find("\r\n\r\n", from) != std::string_view::npos ||
          unread.size() >= kMaxHeadBytes) {
        break;
      }
      searched = buf_.size();
      const auto got = fill(deadline);
      if (got == 0) return Head::kClosed;
      if (got < 0) return Clock::now() >= deadline ? Head::kTimedOut : Head::kClosed;
    }
    request_by_ = now + seconds(limits_.request_timeout_s);
    return Head::kReady;
  }

  bool is_readable() const override { return buffered() > 0 || wait(POLLIN, read_deadline()) > 0; }

  // Writable, and not closed by the client (a hang-up cancels the work a
  // stream is waiting for, as httplib's own stream tells it).
  bool is_writable() const override {
    if (wait(POLLOUT, Clock::now() + std::chrono::seconds(CPPHTTPLIB_WRITE_TIMEOUT_SECOND)) <= 0) {
      return false;
    }
    pollfd p{.fd = sock_, .events = POLLIN, .revents = 0};
    if (::poll(&p, 1, 0) <= 0) return true;
    char byte;
    return ::recv(sock_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (buffered() > 0) {
      const size_t n = std::min(size, buffered());
      std::memcpy(ptr, buf_.data() + pos_, n);
      pos_ += n;
      if (pos_ == buf_.size()) {
        buf_.clear();
        pos_ = 0;
      }
      return static_cast<ssize_t>(n);
    }
    const ssize_t n = wait(POLLIN, read_deadline()) > 0 ? receive(ptr, size) : -1;
    if (n <= 0) broken_ = true;
    return n;
  }

  // Whether the buffered request starts with `prefix`.
  bool starts_with(std::string_view prefix) const {
    return std::string_view(buf_).substr(pos_).starts_with(prefix);
  }

  // A read failed (timed out, the client closed): what is left of the
  // request cannot be found, so no next request is read from it.
  bool broken() const { return broken_; }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(::getsockname, ip, port);
  }
  socket_t socket() const override { return sock_; }

 private:
  size_t buffered() const { return buf_.size() - pos_; }

  // A read waits up to httplib's read timeout, and never past the request's
  // own deadline while its head and body are read.
  Clock::time_point read_deadline() const {
    const auto per_read = Clock::now() + std::chrono::seconds(CPPHTTPLIB_READ_TIMEOUT_SECOND);
    return request_by_ ? std::min(per_read, *request_by_) : per_read;
  }

  bool stopped() const { return listener_.load() == INVALID_SOCKET; }

  // > 0: ready; 0: the deadline passed or the server stopped; < 0: error.
  int wait(short events, Clock::time_point deadline) const {
    while (!stopped()) {
      const auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero()) return 0;
      const auto slice = std::min<Clock::duration>(left, kStopPoll);
      pollfd p{.fd = sock_, .events = events, .revents = 0};
      const int r = ::poll(
          &p, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(slice).count()));
      if (r > 0) return r;
      if (r < 0 && errno != EINTR) return -1;
    }
    return 0;
  }

  ssize_t receive(char* ptr, size_t size) {
    ssize_t n;
    do {
      n = ::recv(sock_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  // Appends what arrives before `deadline`: > 0 bytes read, 0 the client
  // closed, < 0 nothing in time (or an error, or the server stopped).
  ssize_t fill(Clock::time_point deadline) {
    if (wait(POLLIN, deadline) <= 0) return -1;
    char chunk[4096];
    const ssize_t n = receive(chunk, sizeof chunk);
    if (n > 0) buf_.append(chunk, static_cast<size_t>(n));
    return n < 0 ? -1 : n;
  }

  void address(int (*get)(int, sockaddr*, socklen_t*), std::string& ip, int& port) const {
    address_of(get, sock_, ip, port);
  }

  socket_t sock_;
  const ConnectionLimits& limits_;
  const std::atomic<socket_t>& listener_;
  std::string buf_;
  size_t pos_ = 0;
  std::optional<Clock::time_point> request_by_;
  bool broken_ = false;
};

std::string_view reason_phrase(int status) {
  switch (status) {
    case 408:
      return "Request Timeout";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

}  // namespace

HttpServer::HttpServer() {
  new_task_queue = [] { return new ConnectionThreads(); };
}

void HttpServer::set_connection_limits(const ConnectionLimits& limits, ErrorBody error_body) {
  limits_ = limits;
  error_body_ = std::move(error_body);
}

void HttpServer::refuse(socket_t sock, int status, const std::string& message) const {
  const std::string body = error_body_ ? error_body_(status, message) : message;
  const std::string response = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n\r\n{}",
      status, reason_phrase(status), body.size(), body);
  (void)::send(sock, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool HttpServer::client_gone() {
  const socket_t sock = current_connection;
  if (sock == INVALID_SOCKET) return false;
  pollfd p{.fd = sock, .events = POLLIN | POLLRDHUP, .revents = 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLRDHUP)) != 0) return true;
  char byte;
  return ::recv(sock, &byte, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

bool HttpServer::take_client_slot(const std::string& client, int32_t& open_from_it) {
  std::lock_guard lock(clients_mutex_);
  int32_t& n = clients_[client];
  open_from_it = n + 1;
  if (n >= limits_.max_connections_per_client) {
    if (n == 0) clients_.erase(client);
    return false;
  }
  ++n;
  return true;
}

void HttpServer::release_client_slot(const std::string& client) {
  std::lock_guard lock(clients_mutex_);
  const auto it = clients_.find(client);
  if (it != clients_.end() && --it->second <= 0) clients_.erase(it);
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  const auto accepted = Clock::now();
  const int32_t open = open_.fetch_add(1) + 1;
  // A share smaller than the cap is kept per address; otherwise the cap
  // alone bounds every client.
  const bool shared = limits_.max_connections_per_client > 0 &&
                      limits_.max_connections_per_client < limits_.max_connections;
  std::string client;
  int port = 0;
  if (shared) address_of(::getpeername, sock, client, port);
  int32_t from_client = 0;
  const bool counted = shared && take_client_slot(client, from_client);
  if (shared && !counted) {
    per_client_refused_.fetch_add(1);
    refuse(sock, 503,
           fmt::format("too many connections from {}: {} open, one client may hold {} "
                       "(serve --max-connections-per-client)",
                       client, from_client, limits_.max_connections_per_client));
  } else if (open > limits_.max_connections) {
    serve_health_only(sock, accepted, open);
  } else {
    serve(sock, accepted);
  }
  if (counted) release_client_slot(client);
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
  open_.fetch_sub(1);
  return true;
}

void HttpServer::serve(socket_t sock, Clock::time_point accepted) {
  ConnectionStream strm(sock, limits_, svr_sock_);
  for (int32_t served = 0; served < limits_.max_requests; ++served) {
    using Head = ConnectionStream::Head;
    const Head head =
        served == 0 ? strm.await_head(accepted + seconds(limits_.header_timeout_s),
                                      accepted + seconds(limits_.header_timeout_s))
                    : strm.await_head(Clock::now() + seconds(limits_.idle_timeout_s), std::nullopt);
    if (head == Head::kTimedOut) {
      timed_out_.fetch_add(1);
      refuse(sock, 408,
             fmt::format("the request's line and headers did not arrive within {} s "
                         "(serve --header-timeout)",
                         limits_.header_timeout_s));
    }
    if (head != Head::kReady) break;
    const bool last =
        served + 1 == limits_.max_requests || svr_sock_ == INVALID_SOCKET || closing_.load();
    bool closed = false;
    current_connection = sock;
    const bool ok = process_request(strm, last, closed, nullptr);
    current_connection = INVALID_SOCKET;
    if (!ok || closed || strm.broken()) break;
  }
}

// Over the cap: a GET /health whose head arrives promptly is answered (a
// load balancer's probe tells a full server from a dead one); anything
// else, or nothing, gets 503.
void HttpServer::serve_health_only(socket_t sock, Clock::time_point accepted, int32_t open) {
  if (health_checks_over_cap_.fetch_add(1) < kMaxHealthChecksOverCap) {
    ConnectionStream strm(sock, limits_, svr_sock_);
    const auto by = accepted + seconds(std::min(limits_.header_timeout_s, kHealthCheckHeadS));
    if (strm.await_head(by, by) == ConnectionStream::Head::kReady &&
        (strm.starts_with("GET /health ") || strm.starts_with("GET /health?"))) {
      bool closed = false;
      current_connection = sock;
      process_request(strm, /*close_connection=*/true, closed, nullptr);
      current_connection = INVALID_SOCKET;
      health_checks_over_cap_.fetch_sub(1);
      return;
    }
  }
  health_checks_over_cap_.fetch_sub(1);
  over_limit_.fetch_add(1);
  refuse(sock, 503,
         fmt::format("too many connections: {} open, the server takes {} "
                     "(serve --max-connections)",
                     open, limits_.max_connections));
}

}  // namespace swarmkv::server
