// A small synchronous Redis client over hiredis 0.14 (Debian 12's): the one
// place that includes hiredis.h. The snapshot bus and the job queue
// (swarmkv/cluster.h) speak to Redis only through it.
//
// Every failure is an Error naming the server's address (never its password)
// and the command: kInvalidArgument for a malformed URL or refused
// credentials, kIo for everything else (unreachable, timed out, connection
// lost and not re-established, an error reply).
//
// Thread rules: a Client is thread-compatible: one thread uses it at a time;
// give every thread its own Client.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace swarmkv::redis {

struct Url {
  std::string host;
  int port = 6379;
  std::string user;      // empty: the default user (AUTH password)
  std::string password;  // empty: no AUTH
  int db = 0;
  // "redis://host:port[/db]", with the user but never the password: for messages.
  std::string address() const;
};

// Parses redis://[user[:password]@]host[:port][/db]; a password may also be
// given alone as redis://:password@host. Throws Error(kInvalidArgument)
// naming what is wrong (the password is never echoed).
Url parse_url(std::string_view text);

// `explicit_url` when not empty, else $SWARMKV_REDIS. Throws
// Error(kInvalidArgument) when neither is set, naming both.
Url resolve_url(std::string_view explicit_url);

struct ClientOptions {
  double connect_timeout_s = 2;   // one TCP connect
  double command_timeout_s = 10;  // a reply, blocking commands' BLOCK included
  // After a lost connection: attempts for this long, waiting 0.1 s, 0.2 s,
  // ... (doubling, at most 2 s) before each. A worker rides out any outage
  // (infinity), a coordinator one within its run's timeout.
  double reconnect_for_s = 6;
  // Set: the attempts stop when it turns true (a worker's SIGTERM), with the
  // same error as when the time is up.
  const std::atomic<bool>* stop = nullptr;
};

// A reply as a value (hiredis' reply tree copied out and freed).
struct Reply {
  enum class Type { kNil, kString, kStatus, kInteger, kArray, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  long long integer = 0;
  std::vector<Reply> elements;  // kArray

  bool is_nil() const noexcept { return type == Type::kNil; }
  bool is_error() const noexcept { return type == Type::kError; }
};

class Client {
 public:
  // Connects once (no retry: a server that is down fails at once), then AUTH
  // and SELECT as the URL says and a PING. Throws Error(kIo) "redis://h:p:
  // cannot connect: <reason>", Error(kInvalidArgument) "redis://h:p: AUTH
  // refused: <server's reason>" or, without a password, "... requires a
  // password: give it in the URL, redis://[user:]PASSWORD@host:port".
  explicit Client(Url url, ClientOptions options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one command and returns its reply. A connection lost before or
  // during it is re-established (bounded backoff, ClientOptions) and the
  // command sent once more, so a command may run twice: callers send only
  // commands whose repetition is harmless. Throws Error(kIo) "redis://h:p:
  // <COMMAND>: <reason>" for a lost connection that could not be
  // re-established, a timeout, and an error reply.
  Reply command(const std::vector<std::string>& args);
  // The same, but an error reply is returned (Reply::kError) instead of thrown.
  Reply try_command(const std::vector<std::string>& args);

  const Url& url() const noexcept { return url_; }
  // Times the connection was re-established; a caller that keeps state in
  // the server checks it is still there when this grows.
  uint64_t reconnects() const noexcept { return reconnects_; }
  // ClientOptions::reconnect_for_s from now on (a run's time left).
  void set_reconnect_for_s(double s) noexcept { options_.reconnect_for_s = s; }

 private:
  struct Connection;
  void connect();
  void reconnect(const std::string& command, const std::string& reason);

  Url url_;
  ClientOptions options_;
  std::unique_ptr<Connection> conn_;
  uint64_t reconnects_ = 0;
};

}  // namespace swarmkv::redis
