// The Redis client and the snapshot bus against a real redis-server of the
// test's own (label redis). No model: seconds.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <thread>

#include "cluster/job_split.h"
#include "cluster/keys.h"
#include "redis_server.h"
#include "spec_fixtures.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/redis.h"
#include "swarmkv/result_json.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace {

using swarmkv::testing::RedisServer;
namespace fs = std::filesystem;

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed = 1) {
  std::vector<uint8_t> out(n);
  std::mt19937 rng(seed);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  return out;
}

// ------------------------------------------------------------------ URLs

// The message parse_url refuses `url` with.
std::string url_error(const char* url) {
  return fixtures::error_of([&] { redis::parse_url(url); }).message;
}

TEST(RedisUrlTest, PartsAreParsed) {
  const redis::Url u = redis::parse_url("redis://alice:s3cr:et@10.0.0.5:6390/2");
  EXPECT_EQ(u.host, "10.0.0.5");
  EXPECT_EQ(u.port, 6390);
  EXPECT_EQ(u.user, "alice");
  EXPECT_EQ(u.password, "s3cr:et");
  EXPECT_EQ(u.db, 2);
  EXPECT_EQ(u.address(), "redis://alice@10.0.0.5:6390/2");  // never the password

  const redis::Url p = redis::parse_url("redis://:pw@localhost");
  EXPECT_EQ(p.user, "");
  EXPECT_EQ(p.password, "pw");
  EXPECT_EQ(p.port, 6379);
  EXPECT_EQ(p.address(), "redis://localhost:6379");
  EXPECT_EQ(redis::parse_url("redis://[::1]:7000").host, "::1");
  EXPECT_EQ(redis::parse_url("redis://[::1]:7000").address(), "redis://[::1]:7000");
}

TEST(RedisUrlTest, MalformedUrlsAreNamedWithoutThePassword) {
  EXPECT_EQ(fixtures::error_of([] { redis::parse_url("http://h:1"); }).message,
            "redis URL 'http://h:1' must start with redis:// or, for TLS, rediss:// "
            "(redis[s]://[user[:password]@]host[:port][/db])");
  EXPECT_EQ(fixtures::error_of([] { redis::parse_url("redis://u:topsecret@h:99999"); }).message,
            "redis URL 'redis://u:***@h:99999': port 99999 is outside 1-65535");
  EXPECT_EQ(fixtures::error_of([] { redis::parse_url("redis://h:port"); }).message,
            "redis URL 'redis://h:port': the port 'port' is not a number");
  EXPECT_EQ(fixtures::error_of([] { redis::parse_url("redis://:6379"); }).message,
            "redis URL 'redis://:6379' has no host");
  EXPECT_EQ(fixtures::error_of([] { redis::parse_url("redis://bob@h:1"); }).message,
            "redis URL 'redis://bob@h:1' names user 'bob' without a password "
            "(redis://user:password@host:port)");
  EXPECT_EQ(fixtures::error_of([] { redis::parse_url("redis://h:1"); }).code, ErrorCode::kInternal);
}

TEST(RedisUrlTest, TlsUrlsNameTheirFiles) {
  const redis::Url u = redis::parse_url(
      "rediss://:pw@10.0.0.5:6390/1?cacert=/etc/ca.pem&cert=/home/a%40b/c.pem&key=k%26.pem");
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.host, "10.0.0.5");
  EXPECT_EQ(u.port, 6390);
  EXPECT_EQ(u.db, 1);
  EXPECT_EQ(u.password, "pw");
  EXPECT_EQ(u.ca_file, "/etc/ca.pem");
  EXPECT_EQ(u.cert_file, "/home/a@b/c.pem");
  EXPECT_EQ(u.key_file, "k&.pem");
  EXPECT_EQ(u.address(), "rediss://10.0.0.5:6390/1");
  EXPECT_FALSE(redis::parse_url("redis://h").tls);
  EXPECT_TRUE(redis::parse_url("redis://10.0.0.5").clear_text_off_host());
  EXPECT_TRUE(redis::parse_url("redis://redis.example").clear_text_off_host());
  EXPECT_FALSE(redis::parse_url("rediss://10.0.0.5").clear_text_off_host());
  EXPECT_FALSE(redis::parse_url("redis://127.0.0.2").clear_text_off_host());
  EXPECT_FALSE(redis::parse_url("redis://[::1]:7000").clear_text_off_host());
  EXPECT_FALSE(redis::parse_url("redis://[0:0::1]:7000").clear_text_off_host());
  EXPECT_TRUE(redis::parse_url("redis://[fd00::5]:7000").clear_text_off_host());
  EXPECT_FALSE(redis::parse_url("redis://localhost").clear_text_off_host());
  EXPECT_EQ(redis::parse_url("rediss://h").ca_file, "");  // the system's CAs

  EXPECT_EQ(url_error("redis://h?cacert=ca.pem"),
            "redis URL 'redis://h?cacert=ca.pem': 'cacert' is for TLS: write rediss://");
  EXPECT_EQ(url_error("rediss://u:secret@h?ca=x"),
            "redis URL 'rediss://u:***@h?ca=x': unknown parameter 'ca' (rediss:// takes cacert, "
            "cert and key, each a file)");
  EXPECT_EQ(url_error("rediss://h?cacert="),
            "redis URL 'rediss://h?cacert=': 'cacert' names no file");
  EXPECT_EQ(url_error("rediss://h?cert=c.pem"),
            "redis URL 'rediss://h?cert=c.pem': a client certificate needs both cert= and key=");
  EXPECT_EQ(url_error("rediss://h?cacert=a%4"),
            "redis URL 'rediss://h?cacert=a%4': '%' in 'a%4' is not followed by two hex digits");
}

// RFC 3986: the userinfo is what comes before the authority's first '@',
// and the authority ends at the first '/', '?' or '#'.
TEST(RedisUrlTest, AnAtInTheQueryLeavesTheHostWhereItIs) {
  const redis::Url u =
      redis::parse_url("rediss://:pw@10.0.0.5:6390/1?cert=/home/a@b/c.pem&key=k@.pem");
  EXPECT_EQ(u.host, "10.0.0.5");
  EXPECT_EQ(u.port, 6390);
  EXPECT_EQ(u.db, 1);
  EXPECT_EQ(u.password, "pw");
  EXPECT_EQ(u.cert_file, "/home/a@b/c.pem");
  EXPECT_EQ(u.key_file, "k@.pem");
  const redis::Url no_password = redis::parse_url("rediss://h:7000?cacert=/x@y/ca.pem");
  EXPECT_EQ(no_password.host, "h");
  EXPECT_EQ(no_password.port, 7000);
  EXPECT_EQ(no_password.password, "");
  EXPECT_EQ(no_password.ca_file, "/x@y/ca.pem");
}

TEST(RedisUrlTest, UserAndPasswordArePercentDecoded) {
  const redis::Url u = redis::parse_url("redis://al%40ice:p%40ss%3Aw%25rd%2F@h:1");
  EXPECT_EQ(u.user, "al@ice");
  EXPECT_EQ(u.password, "p@ss:w%rd/");
  EXPECT_EQ(u.host, "h");
  EXPECT_EQ(redis::parse_url("redis://:%23%3F@h").password, "#?");
}

TEST(RedisUrlTest, WhatRfc3986RefusesIsNamedWithoutThePassword) {
  EXPECT_EQ(url_error("redis://h:"),
            "redis URL 'redis://h:': the port after ':' is empty (leave out the ':' for 6379)");
  EXPECT_EQ(url_error("redis://u:pw@[::1]:/2"),
            "redis URL 'redis://u:***@[::1]:/2': the port after ':' is empty (leave out the ':' "
            "for 6379)");
  EXPECT_EQ(url_error("redis://u:p@ss@h:1"),
            "redis URL 'redis://u:***@h:1': more than one '@' before the host: write an '@' in "
            "the user name or password as %40");
  EXPECT_EQ(url_error("redis://:p%4@h"),
            "redis URL 'redis://:***@h': '%' in the password is not followed by two hex digits");
  EXPECT_EQ(url_error("redis://h:1/0#top"),
            "redis URL 'redis://h:1/0#top': a '#' fragment means nothing to Redis (write a '#' "
            "in a password as %23)");
  // A '/', '?' or '#' in a password ends the authority early: still masked.
  EXPECT_EQ(url_error("redis://:pa#ss@h"),
            "redis URL 'redis://:***@h': a '#' fragment means nothing to Redis (write a '#' in a "
            "password as %23)");
  EXPECT_EQ(url_error("redis://:pa/ss@h").find("pa"), std::string::npos)
      << url_error("redis://:pa/ss@h");
}

TEST(RedisUrlTest, TheEnvironmentIsTheFallback) {
  ::unsetenv("SWARMKV_REDIS");
  EXPECT_EQ(fixtures::error_of([] { redis::resolve_url(""); }).message,
            "no Redis server given: pass --redis redis://[user:password@]host:port or set "
            "$SWARMKV_REDIS");
  ::setenv("SWARMKV_REDIS", "redis://envhost:1234", 1);
  EXPECT_EQ(redis::resolve_url("").host, "envhost");
  EXPECT_EQ(redis::resolve_url("redis://given:1").host, "given");
  ::setenv("SWARMKV_REDIS", "nonsense", 1);
  EXPECT_EQ(fixtures::error_of([] {
              redis::resolve_url("");
            }).message.rfind("$SWARMKV_REDIS: redis URL", 0),
            0u);
  ::unsetenv("SWARMKV_REDIS");
}

// ------------------------------------------------------------------ client

TEST(RedisClientTest, ServerDownFailsAtOnceNamingTheAddress) {
  const int port = swarmkv::testing::free_loopback_port();
  const auto t0 = std::chrono::steady_clock::now();
  const ErrorValue e = fixtures::error_of(
      [&] { redis::Client c(redis::parse_url(fmt::format("redis://127.0.0.1:{}", port))); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(e.code, ErrorCode::kIo);
  EXPECT_EQ(e.message,
            fmt::format("redis://127.0.0.1:{}: cannot connect: Connection refused", port));
}

TEST(RedisClientTest, CommandsAndErrorRepliesAreTyped) {
  RedisServer server;
  redis::Client c(redis::parse_url(server.url()));
  EXPECT_EQ(c.command({"SET", "k", std::string("a\0b", 3)}).str, "OK");
  EXPECT_EQ(c.command({"GET", "k"}).str, std::string("a\0b", 3));  // binary safe
  EXPECT_TRUE(c.command({"GET", "missing"}).is_nil());
  EXPECT_EQ(c.command({"INCR", "n"}).integer, 1);
  EXPECT_TRUE(c.try_command({"INCR", "k"}).is_error());
  const ErrorValue e = fixtures::error_of([&] { c.command({"INCR", "k"}); });
  EXPECT_EQ(e.code, ErrorCode::kIo);
  EXPECT_EQ(e.message, server.url() + ": INCR: ERR value is not an integer or out of range");
}

TEST(RedisClientTest, PasswordsAndAclUsers) {
  RedisServer server({"--requirepass", "right"});
  EXPECT_EQ(redis::Client(redis::parse_url(server.url(":right"))).command({"PING"}).str, "PONG");
  const ErrorValue wrong =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(server.url(":wrong"))); });
  EXPECT_EQ(wrong.code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(wrong.message,
            server.url() +
                ": AUTH refused: WRONGPASS invalid username-password pair or user is disabled.");
  const ErrorValue none =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(server.url())); });
  EXPECT_EQ(none.code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(none.message,
            server.url() +
                ": the server requires a password: give it in the URL, "
                "redis://[user:]PASSWORD@host:port (NOAUTH Authentication required.)");

  redis::Client admin(redis::parse_url(server.url(":right")));
  admin.command({"ACL", "SETUSER", "worker", "on", ">wpw", "~swarmkv:*", "+@all"});
  redis::Client user(redis::parse_url(server.url("worker:wpw")));
  EXPECT_EQ(user.command({"SET", "swarmkv:x", "1"}).str, "OK");
  const ErrorValue denied = fixtures::error_of([&] { user.command({"SET", "other", "1"}); });
  EXPECT_EQ(denied.code, ErrorCode::kIo);
  EXPECT_NE(denied.message.find("NOPERM"), std::string::npos) << denied.message;
}

TEST(RedisClientTest, ARestartedServerIsReconnected) {
  RedisServer server;
  redis::Client c(redis::parse_url(server.url()));
  c.command({"SET", "k", "v"});
  server.stop();
  server.start();  // same port, no data (persistence off)
  EXPECT_TRUE(c.command({"GET", "k"}).is_nil());
  EXPECT_EQ(c.reconnects(), 1u);
}

TEST(RedisClientTest, AServerGoneForGoodFailsWithinTheBackoff) {
  RedisServer server;
  redis::ClientOptions o;
  o.reconnect_for_s = 1;  // attempts after 0.1, 0.3, 0.7 s; the next would be after 1.5 s
  redis::Client c(redis::parse_url(server.url()), o);
  server.stop();
  const auto t0 = std::chrono::steady_clock::now();
  const ErrorValue e = fixtures::error_of([&] { c.command({"GET", "k"}); });
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(took, std::chrono::milliseconds(1000));
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_EQ(e.code, ErrorCode::kIo);
  EXPECT_EQ(e.message.rfind(server.url() + ": GET: connection lost (", 0), 0u) << e.message;
  EXPECT_NE(e.message.find("; not back in "), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(" attempts), the last: " + server.url() +
                           ": cannot connect: Connection refused"),
            std::string::npos)
      << e.message;
}

// A worker's client keeps trying until the server is back, however long
// that takes, and gives up at once when told to stop.
TEST(RedisClientTest, AnUnboundedClientRidesOutAnOutageAndStopsWhenTold) {
  RedisServer server;
  std::atomic<bool> stop{false};
  redis::ClientOptions o;
  o.reconnect_for_s = std::numeric_limits<double>::infinity();
  o.stop = &stop;
  redis::Client c(redis::parse_url(server.url()), o);
  server.stop();
  // The client waits on another thread: a redis-server dies with the thread
  // that started it (PR_SET_PDEATHSIG), so this one restarts it.
  redis::Reply reply;
  std::thread waiting([&] { reply = c.command({"GET", "k"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the 2 s backoff cap
  server.start();
  waiting.join();
  EXPECT_TRUE(reply.is_nil());
  EXPECT_EQ(c.reconnects(), 1u);
  server.stop();
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const ErrorValue e = fixtures::error_of([&] { c.command({"GET", "k"}); });
  stopper.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1500));
  EXPECT_EQ(e.code, ErrorCode::kIo);
  EXPECT_NE(e.message.find("; stopped in "), std::string::npos) << e.message;
}

// ------------------------------------------------------------------ jobs

// Two long answers and six short ones over two workers: each worker gets one
// long answer (cut by count in order, the first job held both), and the
// jobs' costs differ by less than the costliest agent.
// ------------------------------------------------------------------ TLS

class RedisTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::temp_directory_path() /
                        fmt::format("swarmkv-tls-{}-{}", ::getpid(), std::random_device{}()));
    certs_ = new swarmkv::testing::TestCertificates(*dir_);
  }
  static void TearDownTestSuite() {
    delete certs_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static const swarmkv::testing::TestCertificates& certs() { return *certs_; }
  static RedisServer server(const std::string& auth_clients = "no") {
    return RedisServer::tls_only(certs_->server_cert, certs_->server_key, certs_->ca, auth_clients);
  }
  static redis::ClientOptions quick() {
    redis::ClientOptions o;
    o.reconnect_for_s = 0.5;
    return o;
  }

 private:
  static fs::path* dir_;
  static swarmkv::testing::TestCertificates* certs_;
};
fs::path* RedisTlsTest::dir_ = nullptr;
swarmkv::testing::TestCertificates* RedisTlsTest::certs_ = nullptr;

TEST_F(RedisTlsTest, AServerWithACertificateOfTheGivenCaAnswers) {
  RedisServer s = server();
  redis::Client c(redis::parse_url(s.url() + "?cacert=" + certs().ca));
  EXPECT_EQ(c.url().address(), fmt::format("rediss://127.0.0.1:{}", s.port()));
  const std::string value(3u << 20, '\x7f');  // several TLS records each way
  EXPECT_EQ(c.command({"SET", "k", value}).str, "OK");
  EXPECT_EQ(c.command({"GET", "k"}).str, value);
  EXPECT_NE(c.command({"INFO", "server"}).str.find("redis_version:"), std::string::npos);
}

TEST_F(RedisTlsTest, ACertificateThatDoesNotVerifyIsRefusedAsUnauthenticated) {
  RedisServer s = server();
  // Not signed by the system's CAs.
  const ErrorValue system =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(s.url()), quick()); });
  EXPECT_EQ(system.code, ErrorCode::kUnauthenticated) << system.message;
  EXPECT_EQ(system.message,
            s.url() +
                ": the server's certificate does not verify: self-signed certificate in "
                "certificate chain (checked against the system's CAs; cacert=FILE names others)");
  // Signed by the CA, but for 127.0.0.1, not "localhost".
  const std::string by_name = fmt::format("rediss://localhost:{}?cacert={}", s.port(), certs().ca);
  const ErrorValue name =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(by_name), quick()); });
  EXPECT_EQ(name.code, ErrorCode::kUnauthenticated) << name.message;
  EXPECT_EQ(name.message, fmt::format("rediss://localhost:{}: the server's certificate does not "
                                      "verify: hostname mismatch (CAs: {})",
                                      s.port(), certs().ca));
  // The right address, a certificate from another CA.
  RedisServer stranger =
      RedisServer::tls_only(certs().stranger_cert, certs().stranger_key, certs().ca, "no");
  const ErrorValue other = fixtures::error_of([&] {
    redis::Client c(redis::parse_url(stranger.url() + "?cacert=" + certs().ca), quick());
  });
  EXPECT_EQ(other.code, ErrorCode::kUnauthenticated) << other.message;
  EXPECT_NE(other.message.find("does not verify: unable to get local issuer certificate"),
            std::string::npos)
      << other.message;
}

// A plain server never answers a TLS hello (it waits for the end of an
// inline command): the handshake is bounded by the connect timeout.
TEST_F(RedisTlsTest, PlainAndTlsDoNotMixAndSayWhy) {
  RedisServer tls = server();
  const std::string plain_to_tls = fmt::format("redis://127.0.0.1:{}", tls.port());
  const auto t0 = std::chrono::steady_clock::now();
  const ErrorValue a =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(plain_to_tls), quick()); });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  EXPECT_EQ(a.code, ErrorCode::kIo) << a.message;
  EXPECT_EQ(a.message.rfind(plain_to_tls + ": cannot connect: PING: ", 0), 0u) << a.message;
  EXPECT_NE(a.message.find("(if the server's port speaks TLS, write rediss://)"), std::string::npos)
      << a.message;

  RedisServer plain;
  const std::string tls_to_plain =
      fmt::format("rediss://127.0.0.1:{}?cacert={}", plain.port(), certs().ca);
  const auto t1 = std::chrono::steady_clock::now();
  const ErrorValue b =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(tls_to_plain), quick()); });
  EXPECT_LT(std::chrono::steady_clock::now() - t1, std::chrono::seconds(5));  // connect: 2 s
  EXPECT_EQ(b.code, ErrorCode::kIo) << b.message;
  EXPECT_EQ(b.message.rfind(fmt::format("rediss://127.0.0.1:{}: cannot connect: TLS handshake "
                                        "failed: no answer within 2.0 s",
                                        plain.port()),
                            0),
            0u)
      << b.message;
}

TEST_F(RedisTlsTest, AServerThatAsksForAClientCertificateGetsOne) {
  RedisServer s = server("yes");
  const std::string with_cert = fmt::format("{}?cacert={}&cert={}&key={}", s.url(), certs().ca,
                                            certs().client_cert, certs().client_key);
  EXPECT_EQ(redis::Client(redis::parse_url(with_cert)).command({"PING"}).str, "PONG");
  const ErrorValue without = fixtures::error_of(
      [&] { redis::Client c(redis::parse_url(s.url() + "?cacert=" + certs().ca), quick()); });
  EXPECT_EQ(without.code, ErrorCode::kIo) << without.message;
  // The server drops it after the handshake (TLS 1.3: the client's part is
  // done before the server checks it), with a FIN or a reset.
  EXPECT_EQ(without.message.rfind(s.url() + ": cannot connect: PING: ", 0), 0u) << without.message;
  EXPECT_TRUE(without.message.ends_with(
      " (if the server asks for a client certificate, give cert=FILE&key=FILE)"))
      << without.message;

  const ErrorValue no_file = fixtures::error_of(
      [&] { redis::Client c(redis::parse_url(s.url() + "?cacert=/nonexistent/ca.pem"), quick()); });
  EXPECT_EQ(no_file.code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(no_file.message.rfind(s.url() + ": cannot load the CA file '/nonexistent/ca.pem' "
                                            "(cacert=): ",
                                  0),
            0u)
      << no_file.message;
  const std::string wrong_key = fmt::format("{}?cacert={}&cert={}&key={}", s.url(), certs().ca,
                                            certs().client_cert, certs().server_key);
  const ErrorValue mismatch =
      fixtures::error_of([&] { redis::Client c(redis::parse_url(wrong_key), quick()); });
  EXPECT_EQ(mismatch.code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(mismatch.message, s.url() + ": cannot load the private key '" + certs().server_key +
                                  "' (key=): error:05800074:x509 certificate routines::key "
                                  "values mismatch");
}

TEST_F(RedisTlsTest, ALostConnectionIsReestablishedOverTls) {
  RedisServer s = server();
  const redis::Url url = redis::parse_url(s.url() + "?cacert=" + certs().ca);
  redis::Client c(url);
  redis::Client admin(url);
  c.command({"CLIENT", "SETNAME", "victim"});
  admin.command({"CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"});
  EXPECT_EQ(c.command({"PING"}).str, "PONG");
  EXPECT_EQ(c.reconnects(), 1u);
}

TEST(JobSplitTest, JobsAreCutByCostNotByCount) {
  const std::vector<int64_t> cost = {520, 530, 20, 20, 20, 20, 20, 20};
  const std::vector<size_t> agents = {0, 1, 2, 3, 4, 5, 6, 7};
  const auto jobs = cluster::split_by_cost(agents, cost, 2);
  ASSERT_EQ(jobs.size(), 2u);
  EXPECT_EQ(jobs[0], (std::vector<size_t>{1, 3, 5, 7}));
  EXPECT_EQ(jobs[1], (std::vector<size_t>{0, 2, 4, 6}));
  const auto sum = [&](const std::vector<size_t>& job) {
    int64_t s = 0;
    for (const size_t i : job) s += cost[i];
    return s;
  };
  EXPECT_LT(std::abs(sum(jobs[0]) - sum(jobs[1])), 530);
}

TEST(JobSplitTest, EveryAgentOnceInOrderAndNoEmptyJob) {
  const std::vector<int64_t> cost = {5, 1, 9, 9, 3};
  const std::vector<size_t> agents = {4, 2, 0};  // a submit of three agents, in its order
  EXPECT_EQ(cluster::split_by_cost(agents, cost, 8),
            (std::vector<std::vector<size_t>>{{2}, {0}, {4}}));
  EXPECT_EQ(cluster::split_by_cost(agents, cost, 1), (std::vector<std::vector<size_t>>{{4, 2, 0}}));
  EXPECT_EQ(cluster::split_by_cost(agents, cost, 0), (std::vector<std::vector<size_t>>{{4, 2, 0}}));
  EXPECT_TRUE(cluster::split_by_cost({}, cost, 2).empty());
}

// ------------------------------------------------------------------ snapshot bus

class SnapshotBusTest : public ::testing::Test {
 protected:
  RedisServer server_;
  redis::Client redis_{redis::parse_url(server_.url())};
  cluster::BusOptions small_chunks() {
    cluster::BusOptions o;
    o.chunk_bytes = 1000;
    o.ttl_s = 120;
    return o;
  }
  long long keys_matching(const std::string& pattern) {
    return static_cast<long long>(redis_.command({"KEYS", pattern}).elements.size());
  }
};

TEST_F(SnapshotBusTest, PublishThenFetchGivesTheSameBytes) {
  const std::vector<uint8_t> file = random_bytes(4500);
  const cluster::PublishReport p = cluster::publish_snapshot(redis_, "k1", file, small_chunks());
  EXPECT_TRUE(p.published);
  EXPECT_EQ(p.chunks, 5u);  // 4 x 1000 + 500
  EXPECT_EQ(keys_matching("swarmkv:snap:k1:*"), 5);
  cluster::FetchReport f;
  EXPECT_EQ(cluster::fetch_snapshot(redis_, "k1", {}, &f), file);
  EXPECT_EQ(f.bytes, 4500u);
  EXPECT_EQ(f.refetched_chunks, 0);
  // Every key expires.
  EXPECT_GT(redis_.command({"TTL", "swarmkv:snap:k1"}).integer, 100);
  for (const redis::Reply& k : redis_.command({"KEYS", "swarmkv:snap:k1:*"}).elements)
    EXPECT_GT(redis_.command({"TTL", k.str}).integer, 100) << k.str;
}

TEST_F(SnapshotBusTest, TheSecondPublisherOfAKeyLosesAndLeavesNothing) {
  const std::vector<uint8_t> first = random_bytes(2500, 1);
  const std::vector<uint8_t> second = random_bytes(2500, 2);
  EXPECT_TRUE(cluster::publish_snapshot(redis_, "k", first, small_chunks()).published);
  EXPECT_FALSE(cluster::publish_snapshot(redis_, "k", second, small_chunks()).published);
  EXPECT_EQ(keys_matching("swarmkv:snap:k:*"), 3);  // the first upload's chunks only
  EXPECT_EQ(cluster::fetch_snapshot(redis_, "k", {}), first);
}

TEST_F(SnapshotBusTest, ADamagedChunkIsNamed) {
  cluster::publish_snapshot(redis_, "k", random_bytes(2500), small_chunks());
  const cluster::Manifest m = *cluster::find_snapshot(redis_, "k", {});
  redis_.command({"SETRANGE", fmt::format("swarmkv:snap:k:{}:1", m.upload), "10", "X"});
  const ErrorValue e = fixtures::error_of([&] { cluster::fetch_snapshot(redis_, "k", {}); });
  EXPECT_EQ(e.code, ErrorCode::kCorruption);
  EXPECT_EQ(e.message, server_.url() +
                           ": snapshot k: chunk 1 of 3 fails its checksum twice (1000 bytes, "
                           "expected 1000)");
  redis_.command({"DEL", fmt::format("swarmkv:snap:k:{}:2", m.upload)});
  redis_.command({"SET", fmt::format("swarmkv:snap:k:{}:1", m.upload), "short"});
  EXPECT_EQ(fixtures::error_of([&] { cluster::fetch_snapshot(redis_, "k", {}); }).message,
            server_.url() +
                ": snapshot k: chunk 1 of 3 fails its checksum twice (5 bytes, "
                "expected 1000)");
}

TEST_F(SnapshotBusTest, MissingSnapshotsAndChunksAreNamed) {
  const ErrorValue none = fixtures::error_of([&] { cluster::fetch_snapshot(redis_, "nope", {}); });
  EXPECT_EQ(none.code, ErrorCode::kNotFound);
  EXPECT_EQ(none.message, server_.url() + ": the snapshot bus has no snapshot nope");
  cluster::publish_snapshot(redis_, "k", random_bytes(2500), small_chunks());
  const cluster::Manifest m = *cluster::find_snapshot(redis_, "k", {});
  redis_.command({"DEL", fmt::format("swarmkv:snap:k:{}:2", m.upload)});
  const ErrorValue e = fixtures::error_of([&] { cluster::fetch_snapshot(redis_, "k", {}); });
  EXPECT_EQ(e.code, ErrorCode::kCorruption);
  EXPECT_EQ(e.message, server_.url() +
                           ": snapshot k: chunk 2 of 3 is missing (expired or removed); the "
                           "coordinator publishes it again on its next run");
  redis_.command({"SET", "swarmkv:snap:bad", "{not json"});
  EXPECT_EQ(fixtures::error_of([&] { cluster::find_snapshot(redis_, "bad", {}); }).code,
            ErrorCode::kCorruption);
}

TEST_F(SnapshotBusTest, ReplacingNeverLeavesTheKeyWithoutAManifest) {
  const std::vector<uint8_t> first = random_bytes(2500, 1);
  const std::vector<uint8_t> second = random_bytes(2500, 2);
  cluster::publish_snapshot(redis_, "k", first, small_chunks());
  const cluster::Manifest old = *cluster::find_snapshot(redis_, "k", {});
  EXPECT_TRUE(
      cluster::publish_snapshot(redis_, "k", second, small_chunks(), cluster::Publish::kReplace)
          .published);
  EXPECT_EQ(cluster::fetch_snapshot(redis_, "k", {}), second);
  // The old upload's chunks stay a minute for fetches in progress.
  const long long ttl =
      redis_.command({"TTL", fmt::format("swarmkv:snap:k:{}:0", old.upload)}).integer;
  EXPECT_GT(ttl, 0);
  EXPECT_LE(ttl, 60);
}

TEST_F(SnapshotBusTest, AFetchWaitsForASnapshotBeingPublishedAgain) {
  const std::vector<uint8_t> file = random_bytes(2500);
  std::thread publisher([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    redis::Client other(redis::parse_url(server_.url()));
    cluster::publish_snapshot(other, "late", file, small_chunks());
  });
  std::vector<uint8_t> got;
  const ErrorValue e =
      fixtures::error_of([&] { got = cluster::fetch_snapshot(redis_, "late", {}); });
  publisher.join();
  EXPECT_EQ(e.code, ErrorCode::kInternal) << e.message;  // no error
  EXPECT_EQ(got, file);
}

TEST_F(SnapshotBusTest, TouchRenewsEveryKey) {
  cluster::BusOptions o = small_chunks();
  o.ttl_s = 5;
  cluster::publish_snapshot(redis_, "k", random_bytes(1500), o);
  cluster::touch_snapshot(redis_, *cluster::find_snapshot(redis_, "k", {}), 1000);
  EXPECT_GT(redis_.command({"TTL", "swarmkv:snap:k"}).integer, 900);
  for (const redis::Reply& k : redis_.command({"KEYS", "swarmkv:snap:k:*"}).elements)
    EXPECT_GT(redis_.command({"TTL", k.str}).integer, 900);
}

// ------------------------------------------------------------------ signatures

const cluster::ClusterKey kKey(std::string(32, 'k'));
const cluster::ClusterKey kOtherKey(std::string(32, 'o'));

TEST(ClusterKeyTest, AKeyIsAtLeast16BytesAndAFileLosesItsNewline) {
  const ErrorValue short_key =
      fixtures::error_of([] { cluster::ClusterKey("fifteen bytes..").sign("m"); });
  EXPECT_EQ(short_key.code, ErrorCode::kInvalidArgument);
  EXPECT_EQ(short_key.message,
            "a cluster key needs at least 16 bytes (got 15); make one with: openssl rand -hex 32 "
            "> cluster.key");
  const fs::path file = fs::temp_directory_path() / fmt::format("swarmkv-key-{}", ::getpid());
  std::ofstream(file) << std::string(32, 'k') << "\n";
  EXPECT_EQ(cluster::ClusterKey::from_file(file.string()).sign("m"), kKey.sign("m"));
  fs::remove(file);
  EXPECT_EQ(fixtures::error_of([&] { cluster::ClusterKey::from_file(file.string()); }).code,
            ErrorCode::kNotFound);
  // HMAC-SHA256 as Python's hmac module computes it (the tests that sign
  // from Python rely on it): hmac.new(key, msg, hashlib.sha256).hexdigest().
  EXPECT_EQ(cluster::ClusterKey("0123456789abcdef").sign("what do ya want for nothing?"),
            "e9265dc1bf18d4ec36915d9e82226c7ea0fa4e7f8077f611515bd5e29ec9988c");
  EXPECT_TRUE(kKey.verifies("m", kKey.sign("m")));
  EXPECT_FALSE(kKey.verifies("m", kOtherKey.sign("m")));
  EXPECT_FALSE(kKey.verifies("m", ""));
  EXPECT_FALSE(cluster::ClusterKey().verifies("m", ""));
}

// A stream entry's signature covers its stream and every field: moved to
// another stream, a field changed, added or dropped, it is refused.
TEST(ClusterKeyTest, AnEntryIsRefusedUnsignedOrChangedOrMoved) {
  const std::vector<std::pair<std::string, std::string>> fields = {{"run", "r1"},
                                                                   {"agents", "[\"a\"]"}};
  const std::vector<std::string> command = cluster::xadd(kKey, "jobs", 10, fields);
  ASSERT_EQ(command.size(), 6u + 2 * 3);
  EXPECT_EQ(command[10], "sig");
  cluster::StreamEntry e{.id = "1-0", .fields = {}};
  for (size_t i = 6; i + 1 < command.size(); i += 2) e.fields[command[i]] = command[i + 1];
  EXPECT_EQ(cluster::entry_refusal(kKey, "jobs", e), std::nullopt);
  EXPECT_EQ(cluster::entry_refusal(cluster::ClusterKey(), "jobs", e), std::nullopt);
  EXPECT_EQ(cluster::entry_refusal(kOtherKey, "jobs", e), "it is signed with another cluster key");
  EXPECT_EQ(cluster::entry_refusal(kKey, "results", e), "it is signed with another cluster key");
  cluster::StreamEntry changed = e;
  changed.fields["agents"] = "[\"b\"]";
  EXPECT_NE(cluster::entry_refusal(kKey, "jobs", changed), std::nullopt);
  cluster::StreamEntry added = e;
  added.fields["rerun"] = "{}";
  EXPECT_NE(cluster::entry_refusal(kKey, "jobs", added), std::nullopt);
  cluster::StreamEntry unsigned_entry = e;
  unsigned_entry.fields.erase("sig");
  EXPECT_EQ(cluster::entry_refusal(kKey, "jobs", unsigned_entry), "it is unsigned");
  cluster::StreamEntry truncated = e;
  truncated.fields["sig"].resize(40);
  EXPECT_EQ(cluster::entry_refusal(kKey, "jobs", truncated),
            "its signature is malformed (40 characters; a signature is 64 hex digits)");
  cluster::StreamEntry garbled = e;
  garbled.fields["sig"][7] = 'Z';
  EXPECT_EQ(cluster::entry_refusal(kKey, "jobs", garbled),
            "its signature is malformed (64 characters; a signature is 64 hex digits)");
  EXPECT_EQ(cluster::xadd(cluster::ClusterKey(), "jobs", 10, fields).size(), 6u + 2 * 2);
}

TEST(ClusterKeyTest, AJsonMessageIsBoundToItsKey) {
  nlohmann::json doc = {{"pipeline", {{"agents", nlohmann::json::array()}}}, {"guard", "x"}};
  cluster::sign_json(kKey, "swarmkv:run:r1:spec", doc);
  ASSERT_TRUE(doc.contains("sig"));
  nlohmann::json read = nlohmann::json::parse(doc.dump());
  EXPECT_EQ(cluster::json_refusal(kKey, "swarmkv:run:r1:spec", read), std::nullopt);
  EXPECT_FALSE(read.contains("sig"));  // what the reader parses is the message alone
  read = nlohmann::json::parse(doc.dump());
  EXPECT_EQ(cluster::json_refusal(kKey, "swarmkv:run:r2:spec", read),
            "it is signed with another cluster key");
  read = nlohmann::json::parse(doc.dump());
  read["guard"] = "y";
  EXPECT_EQ(cluster::json_refusal(kKey, "swarmkv:run:r1:spec", read),
            "it is signed with another cluster key");
  nlohmann::json not_object = nlohmann::json::array();
  EXPECT_EQ(cluster::json_refusal(kKey, "k", not_object), "it is unsigned");
}

TEST_F(SnapshotBusTest, UnderAKeyOnlyASignedManifestAndItsOwnChunksAreTaken) {
  cluster::BusOptions keyed = small_chunks();
  keyed.cluster_key = kKey;
  const std::vector<uint8_t> file = random_bytes(2500);
  cluster::publish_snapshot(redis_, "k", file, keyed);
  EXPECT_EQ(cluster::fetch_snapshot(redis_, "k", kKey), file);
  EXPECT_EQ(cluster::fetch_snapshot(redis_, "k", {}), file);  // an unkeyed reader looks at nothing
  const ErrorValue other =
      fixtures::error_of([&] { cluster::fetch_snapshot(redis_, "k", kOtherKey); });
  EXPECT_EQ(other.code, ErrorCode::kUnauthenticated);
  EXPECT_EQ(other.message, server_.url() +
                               ": the manifest of snapshot k is refused: it is signed with "
                               "another cluster key");
  cluster::publish_snapshot(redis_, "plain", file, small_chunks());
  EXPECT_EQ(fixtures::error_of([&] { cluster::find_snapshot(redis_, "plain", kKey); }).message,
            server_.url() + ": the manifest of snapshot plain is refused: it is unsigned");

  // A manifest signed with the key whose SHA-256 list does not fit its
  // chunks (a writer with the key and a bug, or chunks swapped for ones
  // with the same XXH3): the chunk is refused, not taken.
  cluster::Manifest m = *cluster::find_snapshot(redis_, "k", kKey);
  m.chunk_sha256[1] = std::string(64, '0');
  m.sig.clear();
  m.sig = kKey.sign("swarmkv manifest\n" + cluster::manifest_to_json(m));
  redis_.command({"SET", "swarmkv:snap:k", cluster::manifest_to_json(m)});
  const ErrorValue sha = fixtures::error_of([&] { cluster::fetch_snapshot(redis_, "k", kKey); });
  EXPECT_EQ(sha.code, ErrorCode::kUnauthenticated);
  EXPECT_EQ(sha.message, server_.url() +
                             ": snapshot k: chunk 1 of 3 is refused: its SHA-256 is not the one "
                             "its signed manifest gives");
  // Republished under the key, the bus's copy is one the key takes again.
  cluster::publish_snapshot(redis_, "k", file, keyed, cluster::Publish::kReplace);
  EXPECT_EQ(cluster::fetch_snapshot(redis_, "k", kKey), file);
}

// ------------------------------------------------------------------ job messages

TEST(ClusterWireTest, ASpecSurvivesTheTrip) {
  // A K/V type left unset stays unset: the worker resolves it as the
  // coordinator does (EngineSettings::context_options), from the exactness that routes the job.
  PipelineSpec default_kv = fixtures::exact_variant(fixtures::spec_with_every_field_set());
  default_kv.kv_type.reset();
  for (const PipelineSpec& spec :
       {fixtures::spec_with_every_field_set(),
        fixtures::exact_variant(fixtures::spec_with_every_field_set()), default_kv}) {
    GuardPolicy guard = GuardPolicy::kSerialized;
    const PipelineSpec back =
        cluster::spec_from_json(cluster::spec_to_json(spec, GuardPolicy::kConcurrent), &guard);
    EXPECT_EQ(guard, GuardPolicy::kConcurrent);
    // The model, the threads and the GPU layers are the worker's own: they do not travel.
    PipelineSpec expected = spec;
    expected.model.clear();
    expected.n_threads = 0;
    expected.n_gpu_layers = 0;
    expected.n_threads_batch = 0;
    EXPECT_EQ(back, expected) << pipeline_json(back).dump(1);
  }
  nlohmann::json bad =
      cluster::spec_to_json(fixtures::spec_with_every_field_set(), GuardPolicy::kSerialized);
  bad["pipeline"]["agents"][0]["needs"] = "sixty";
  const ErrorValue e = fixtures::error_of([&] { cluster::spec_from_json(bad, nullptr); });
  EXPECT_EQ(e.code, ErrorCode::kCorruption);
  EXPECT_NE(e.message.find("a pipeline message does not parse: pipeline: agents[0].needs must be "
                           "a mapping"),
            std::string::npos)
      << e.message;
}

// A worker's result is the agent_json of `run --json`, read back whole.
TEST(ClusterWireTest, AResultKeepsItsTypedErrorTokensAndTimings) {
  for (const AgentResult& r : fixtures::results_with_every_field_set()) {
    EXPECT_EQ(agent_from_json(nlohmann::json::parse(agent_json(r).dump())), r) << agent_json(r);
  }
  nlohmann::json bad = agent_json(fixtures::results_with_every_field_set()[0]);
  bad["status"] = "weird";
  EXPECT_EQ(fixtures::error_of([&] { agent_from_json(bad); }).message, "unknown status 'weird'");
  const ErrorValue missing = fixtures::error_of([&] { agent_from_json(nlohmann::json::object()); });
  EXPECT_EQ(missing.code, ErrorCode::kCorruption);
  EXPECT_NE(missing.message.find("a result does not parse"), std::string::npos) << missing.message;
}

// ------------------------------------------------------------------ a fetched file in the store

class AdoptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("swarmkv-adopt-test-{}", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A valid snapshot file's bytes and its key.
  std::pair<std::vector<uint8_t>, std::string> snapshot_file() {
    SnapshotMeta m;
    m.binding.engine = "e";
    m.binding.model_sha256 = std::string(64, 'a');
    m.binding.layout = {"llama", 30, 192, 192, "f16", "f16", false, false, 0, 256};
    m.tokens = {1, 2, 3, 4};
    const std::string path = (dir_ / "src.swkv").string();
    write_snapshot(path, m, random_bytes(3000));
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    return {bytes, snapshot_key(m.binding, m.tokens)};
  }
  fs::path dir_;
};

TEST_F(AdoptTest, AValidFileBecomesAnEntry) {
  const auto [bytes, key] = snapshot_file();
  SnapshotStore store((dir_ / "store").string());
  const std::string path = store.adopt(key, bytes);
  EXPECT_EQ(path, store.path_of(key));
  EXPECT_EQ(read_snapshot_header(path).meta.tokens, (std::vector<Token>{1, 2, 3, 4}));
}

TEST_F(AdoptTest, BytesOfAnotherKeyOrGarbageAreRefusedAndRemoved) {
  const auto [bytes, key] = snapshot_file();
  SnapshotStore store((dir_ / "store").string());
  const ErrorValue other = fixtures::error_of([&, b = bytes] { store.adopt("0123", b); });
  EXPECT_EQ(other.code, ErrorCode::kCorruption);
  EXPECT_EQ(other.message,
            "snapshot 0123: the snapshot received for key 0123 is the snapshot of key " + key);
  EXPECT_FALSE(fs::exists(store.path_of("0123")));
  std::vector<uint8_t> damaged = bytes;
  damaged[damaged.size() - 10] ^= 0xff;
  const ErrorValue bad = fixtures::error_of([&] { store.adopt(key, damaged); });
  EXPECT_EQ(bad.code, ErrorCode::kCorruption);
  EXPECT_NE(bad.message.find("checksum"), std::string::npos) << bad.message;
  EXPECT_FALSE(fs::exists(store.path_of(key)));
}

}  // namespace
}  // namespace swarmkv
