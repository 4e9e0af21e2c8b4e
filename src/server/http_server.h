// httplib's Server with connections that cannot hold it: each connection
// has a thread of its own (httplib's pool has a fixed count, which clients
// sending a header byte a second filled, so /health waited behind them),
// a request's head must arrive within a deadline, the whole request within
// another, an idle kept-alive connection closes, connections over a cap
// are answered 503 and closed (a GET /health over it is still answered),
// and one client address may hold only a share of the cap.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

namespace swarmkv::server {

struct ConnectionLimits {
  int32_t max_connections = 256;  // open at once; more are answered 503 and closed
  // Open at once from one address (0: max_connections); more from it are
  // answered 503 and closed at once, so one client cannot take the cap.
  int32_t max_connections_per_client = 0;
  // A request's line and headers, from the connection's accept (its first
  // request) or from its first byte (a kept-alive connection's next ones);
  // past it the client gets 408 and the connection closes.
  double header_timeout_s = 10;
  double request_timeout_s = 60;  // line, headers and body, from the first byte
  double idle_timeout_s = 5;      // waiting for the next request on a kept-alive connection
  int32_t max_requests = 100;     // per connection; the last one's answer says Connection: close
};

// The body of an error response the connection layer sends itself: 408 for
// a head that did not arrive in time, 503 over max_connections or over a
// client's share.
using ErrorBody = std::function<std::string(int status, const std::string& message)>;

// Thread-safe as httplib::Server is: configure before listen, stop() from
// any thread.
class HttpServer : public httplib::Server {
 public:
  HttpServer();
  // Before listen.
  void set_connection_limits(const ConnectionLimits& limits, ErrorBody error_body);

  int32_t open_connections() const noexcept { return open_.load(); }
  // Connections closed by a limit: over max_connections, over a client's
  // share, head too slow.
  uint64_t refused_over_limit() const noexcept { return over_limit_.load(); }
  uint64_t refused_per_client() const noexcept { return per_client_refused_.load(); }
  uint64_t timed_out_heads() const noexcept { return timed_out_.load(); }

  // Every answer from now on closes its connection (Connection: close): the
  // server is draining, and a client should not keep a connection to it.
  void close_after_each_request() noexcept { closing_.store(true); }

  // From a route handler: whether the client of the request this thread is
  // answering has closed its connection (a handler that waits for work
  // before it writes anything cancels that work when it has). False
  // outside a handler.
  static bool client_gone();

 private:
  bool process_and_close_socket(socket_t sock) override;
  void serve(socket_t sock, std::chrono::steady_clock::time_point accepted);
  void serve_health_only(socket_t sock, std::chrono::steady_clock::time_point accepted,
                         int32_t open);
  void refuse(socket_t sock, int status, const std::string& message) const;
  // Counts a connection from `client`; false (not counted) over its share.
  bool take_client_slot(const std::string& client, int32_t& open_from_it);
  void release_client_slot(const std::string& client);

  ConnectionLimits limits_;
  ErrorBody error_body_;
  std::atomic<int32_t> open_{0};
  std::atomic<bool> closing_{false};
  std::atomic<int32_t> health_checks_over_cap_{0};
  std::atomic<uint64_t> over_limit_{0};
  std::atomic<uint64_t> per_client_refused_{0};
  std::atomic<uint64_t> timed_out_{0};
  std::mutex clients_mutex_;
  std::unordered_map<std::string, int32_t> clients_;  // open connections per address
};

}  // namespace swarmkv::server
