// The connection layer of `swarmkv serve` on loopback, without a model:
// clients that send their head a byte at a time, or never finish it, or
// open too many connections, cannot keep another client from an answer.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "server/http_server.h"

namespace swarmkv::server {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A plain TCP client: what a slow or hostile one sends, byte by byte.
class RawClient {
 public:
  // `from`: the loopback address to connect from (all of 127/8 is this
  // machine's), so that one test can be several clients.
  explicit RawClient(int port, const char* from = nullptr)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    if (from != nullptr) {
      sockaddr_in local{};
      local.sin_family = AF_INET;
      ::inet_pton(AF_INET, from, &local.sin_addr);
      if (::bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) != 0) return;
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~RawClient() { ::close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  bool send(const std::string& bytes) {
    return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
           static_cast<ssize_t>(bytes.size());
  }
  // Everything until the server closes or `timeout_s` passes.
  std::string read_until_closed(double timeout_s) {
    std::string got;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < deadline) {
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        break;
      }
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  bool closed() const { return closed_; }

 private:
  int fd_;
  bool connected_ = false;
  bool closed_ = false;
};

class HttpServerTest : public ::testing::Test {
 protected:
  void start(const ConnectionLimits& limits) {
    http_.set_connection_limits(limits, [](int status, const std::string& message) {
      return "{\"status\":" + std::to_string(status) + ",\"message\":\"" + message + "\"}";
    });
    http_.Get("/health", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    });
    int listen_fd = -1;
    http_.set_socket_options([&listen_fd](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listen_fd = sock;
    });
    port_ = http_.bind_to_any_port("127.0.0.1");
    ASSERT_GT(port_, 0);
    // As the Server does: httplib's backlog of 5 makes hundreds of connects
    // wait for SYN retries.
    ::listen(listen_fd, SOMAXCONN);
    listener_ = std::thread([this] { http_.listen_after_bind(); });
  }
  void TearDown() override {
    http_.stop();
    if (listener_.joinable()) listener_.join();
  }

  // Waits (5 s at most) until the server counts `n` connections open: one
  // it closed counts until its thread is done, after the client saw it close.
  void await_open(int n) {
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (http_.open_connections() != n && Clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // `n` idle connections, once the server holds them all.
  std::vector<std::unique_ptr<RawClient>> fill_the_cap(int n) {
    std::vector<std::unique_ptr<RawClient>> idle;
    for (int i = 0; i < n; ++i) idle.push_back(std::make_unique<RawClient>(port_));
    await_open(n);
    return idle;
  }

  // Seconds a GET /health took, or a negative number when it failed.
  double time_health() {
    httplib::Client client("127.0.0.1", port_);
    client.set_read_timeout(30, 0);
    const auto start = Clock::now();
    const auto res = client.Get("/health");
    if (!res || res->status != 200) return -1;
    return seconds_since(start);
  }

  HttpServer http_;
  int port_ = 0;
  std::thread listener_;
};

TEST_F(HttpServerTest, ClientsSendingAHeaderByteASecondDoNotHoldOtherClients) {
  // 40 connections that each sent part of a request line and wait: with a
  // fixed pool of handler threads (httplib's, at 16) they held every one,
  // and /health waited for the header deadline.
  start({.max_connections = 256, .header_timeout_s = 20, .request_timeout_s = 60});
  std::vector<std::unique_ptr<RawClient>> slow;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(std::make_unique<RawClient>(port_));
    ASSERT_TRUE(slow.back()->connected());
    ASSERT_TRUE(slow.back()->send("G"));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(http_.open_connections(), 40);
  for (int round = 0; round < 3; ++round) {
    for (auto& c : slow) ASSERT_TRUE(c->send("E"));
    const double s = time_health();
    ASSERT_GE(s, 0) << "round " << round;
    EXPECT_LT(s, 2.0) << "round " << round;
  }
}

TEST_F(HttpServerTest, AHeadThatDoesNotArriveInTimeIsAnswered408AndClosed) {
  start({.max_connections = 256, .header_timeout_s = 0.5, .request_timeout_s = 60});
  RawClient client(port_);
  ASSERT_TRUE(client.connected());
  const auto start = Clock::now();
  ASSERT_TRUE(client.send("GET /health HTTP/1.1\r\nHost: x\r\n"));  // no blank line
  const std::string got = client.read_until_closed(10);
  EXPECT_TRUE(client.closed());
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_EQ(got.rfind("HTTP/1.1 408 Request Timeout\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("did not arrive within 0.5 s (serve --header-timeout)"), std::string::npos)
      << got;
  EXPECT_EQ(http_.timed_out_heads(), 1u);
}

TEST_F(HttpServerTest, AConnectionThatSendsNothingIsClosedWithoutAnAnswer) {
  start({.max_connections = 256, .header_timeout_s = 0.5, .request_timeout_s = 60});
  RawClient client(port_);
  ASSERT_TRUE(client.connected());
  EXPECT_EQ(client.read_until_closed(10), "");
  EXPECT_TRUE(client.closed());
  EXPECT_EQ(http_.timed_out_heads(), 0u);
}

TEST_F(HttpServerTest, ABodyThatDoesNotArriveInTimeEndsTheConnection) {
  start({.max_connections = 256, .header_timeout_s = 5, .request_timeout_s = 0.5});
  http_.Post("/echo", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(req.body, "text/plain");
  });
  RawClient client(port_);
  ASSERT_TRUE(client.connected());
  const auto start = Clock::now();
  ASSERT_TRUE(client.send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nabc"));
  const std::string got = client.read_until_closed(10);
  EXPECT_TRUE(client.closed());
  EXPECT_LT(seconds_since(start), 3.0);  // httplib's own read timeout is 5 s
  EXPECT_EQ(got.find("abc"), std::string::npos) << got;
  EXPECT_EQ(got.find("HTTP/1.1 200"), std::string::npos) << got;
}

// An idle connection over the cap waits at most a second (for a /health
// request, answered even then) before its 503.
TEST_F(HttpServerTest, ConnectionsOverTheCapAreAnswered503AtOnce) {
  start({.max_connections = 3, .header_timeout_s = 20, .request_timeout_s = 60});
  auto idle = fill_the_cap(3);
  ASSERT_EQ(http_.open_connections(), 3);
  RawClient extra(port_);
  const auto start = Clock::now();
  const std::string got = extra.read_until_closed(10);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(got.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("too many connections: 4 open, the server takes 3"), std::string::npos) << got;
  EXPECT_EQ(http_.refused_over_limit(), 1u);
  idle.clear();  // their slots free again
  const auto freed = Clock::now() + std::chrono::seconds(5);
  while (http_.open_connections() > 0 && Clock::now() < freed) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(time_health(), 0);
}

// One address may hold only its share of the cap: 300 idle sockets from
// 127.0.0.1 (the probe's attack: 12 of 14 /health got 503) take 64 of 256,
// and every other client is answered at once.
TEST_F(HttpServerTest, OneClientHoldsOnlyItsShareOfTheConnections) {
  start({.max_connections = 256,
         .max_connections_per_client = 64,
         .header_timeout_s = 60,
         .request_timeout_s = 60});
  std::vector<std::unique_ptr<RawClient>> hog;
  for (int i = 0; i < 300; ++i) {
    hog.push_back(std::make_unique<RawClient>(port_, "127.0.0.1"));
    ASSERT_TRUE(hog.back()->connected());
  }
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (http_.refused_per_client() < 236 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(http_.refused_per_client(), 236u);
  EXPECT_EQ(http_.refused_over_limit(), 0u);
  await_open(64);
  EXPECT_EQ(http_.open_connections(), 64);
  // The refused ones were told why. Which 64 got a slot is up to the
  // threads' order, not the connects': the last refused one is looked for.
  std::string got;
  for (auto it = hog.rbegin(); it != hog.rend() && got.empty(); ++it) {
    got = (*it)->read_until_closed(0.2);
  }
  EXPECT_EQ(got.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << got;
  EXPECT_NE(got.find("too many connections from 127.0.0.1: 65 open, one client may hold 64 "
                     "(serve --max-connections-per-client)"),
            std::string::npos)
      << got;
  // Others are answered at once, while the hog's 64 stay open.
  for (int i = 0; i < 10; ++i) {
    RawClient other(port_, "127.0.0.2");
    ASSERT_TRUE(other.connected());
    const auto start = Clock::now();
    ASSERT_TRUE(other.send("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"));
    const std::string health = other.read_until_closed(10);
    EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
    EXPECT_LT(seconds_since(start), 1.0);
  }
  await_open(64);
  EXPECT_EQ(http_.open_connections(), 64);
}

// At the cap a GET /health is still answered (a load balancer tells a full
// server from a dead one); any other request is answered 503 at once.
TEST_F(HttpServerTest, HealthIsAnsweredEvenAtTheCap) {
  start({.max_connections = 3, .header_timeout_s = 20, .request_timeout_s = 60});
  auto idle = fill_the_cap(3);
  ASSERT_EQ(http_.open_connections(), 3);
  RawClient probe(port_);
  ASSERT_TRUE(probe.send("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string health = probe.read_until_closed(5);
  EXPECT_EQ(health.rfind("HTTP/1.1 200", 0), 0u) << health;
  EXPECT_TRUE(probe.closed());
  RawClient other(port_);
  const auto start = Clock::now();
  ASSERT_TRUE(other.send("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"));
  const std::string got = other.read_until_closed(5);
  EXPECT_LT(seconds_since(start), 0.5);
  EXPECT_EQ(got.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0), 0u) << got;
  EXPECT_EQ(http_.refused_over_limit(), 1u);
}

TEST_F(HttpServerTest, KeptAliveAndPipelinedRequestsAreAllAnswered) {
  start(
      {.max_connections = 256, .header_timeout_s = 5, .request_timeout_s = 60, .max_requests = 3});
  RawClient client(port_);
  ASSERT_TRUE(client.connected());
  const std::string one = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(client.send(one + one + one + one));  // the fourth is past max_requests
  const std::string got = client.read_until_closed(10);
  EXPECT_TRUE(client.closed());
  size_t answers = 0;
  for (size_t at = got.find("HTTP/1.1 200"); at != std::string::npos;
       at = got.find("HTTP/1.1 200", at + 1)) {
    ++answers;
  }
  EXPECT_EQ(answers, 3u) << got;
  EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
}

TEST_F(HttpServerTest, StopEndsConnectionsWaitingForAHeadPromptly) {
  start({.max_connections = 256, .header_timeout_s = 60, .request_timeout_s = 60});
  RawClient client(port_);
  ASSERT_TRUE(client.send("GET /he"));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto start = Clock::now();
  http_.stop();
  listener_.join();
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(http_.open_connections(), 0);
}

}  // namespace
}  // namespace swarmkv::server
