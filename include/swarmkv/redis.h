// A small synchronous Redis client over hiredis 1.x: the one place that
// includes hiredis.h. The snapshot bus and the job queue (swarmkv/cluster.h)
// speak to Redis only through it. rediss:// URLs speak TLS (OpenSSL): the
// server's certificate is checked against the given or the system's CAs and
// against the URL's host name or address.
//
// Every failure is an Error naming the server's address (never its password)
// and the command: kInvalidArgument for a malformed URL, a CA or certificate
// file that does not load, or refused credentials; kUnauthenticated for a
// server whose certificate does not verify; kIo for everything else
// (unreachable, timed out, connection lost and not re-established, an error
// reply).
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
  bool tls = false;  // rediss://
  std::string host;
  int port = 6379;
  std::string user;      // empty: the default user (AUTH password)
  std::string password;  // empty: no AUTH
  int db = 0;
  // rediss:// only, from the query (?cacert=FILE&cert=FILE&key=FILE):
  std::string ca_file;    // PEM CAs the server's certificate must chain to; empty: the system's
  std::string cert_file;  // PEM client certificate (servers with tls-auth-clients), with key_file
  std::string key_file;
  // "redis[s]://host:port[/db]", with the user but never the password: for messages.
  std::string address() const;
  // Plain text to a host other than this one (not 127.0.0.0/8, ::1 or
  // localhost): whoever is on the path reads the traffic.
  bool clear_text_off_host() const;
};

// Parses redis[s]://[user[:password]@]host[:port][/db][?query] by RFC 3986:
// the authority ends at the first '/', '?' or '#', its userinfo at its first
// '@'; user and password are %XX-decoded (%40 for '@'). A password may also
// be given alone as redis://:password@host. The query, for rediss:// only,
// names files: cacert, cert and key (%XX escapes decoded, so %40 and %26
// stand for '@' and '&'). Throws Error(kInvalidArgument) naming what is
// wrong (the password is never echoed): among others a second '@' before
// the host, an empty port ("host:"), a '#' fragment.
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
  // Connects once (no retry: a server that is down fails at once), under
  // rediss:// completes the TLS handshake, then AUTH and SELECT as the URL
  // says and a PING. Throws Error(kIo) "redis://h:p: cannot connect:
  // <reason>" (or "TLS handshake failed: <reason>"), Error(kUnauthenticated)
  // "rediss://h:p: the server's certificate does not verify: <OpenSSL's
  // reason>", Error(kInvalidArgument) for a CA, certificate or key file that
  // does not load, "redis://h:p: AUTH refused: <server's reason>" or, without
  // a password, "... requires a password: give it in the URL,
  // redis://[user:]PASSWORD@host:port".
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
  struct Tls;
  void connect();
  void reconnect(const std::string& command, const std::string& reason);

  Url url_;
  ClientOptions options_;
  std::unique_ptr<Tls> tls_;  // rediss:// only: the SSL_CTX every (re)connect uses
  std::unique_ptr<Connection> conn_;
  uint64_t reconnects_ = 0;
};

}  // namespace swarmkv::redis
