// hiredis behind swarmkv::redis::Client: connection, TLS, AUTH, timeouts,
// bounded reconnects, replies copied into values.
#include "swarmkv/redis.h"

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <hiredis/hiredis_ssl.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "swarmkv/error.h"
#include "swarmkv/host.h"
#include "swarmkv/log.h"

namespace swarmkv::redis {
namespace {

timeval to_timeval(double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

Reply to_value(const redisReply* r) {
  Reply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = Reply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = Reply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = Reply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = Reply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = Reply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(to_value(r->element[i]));
      break;
    default:
      out.type = Reply::Type::kNil;
  }
  return out;
}

int parse_int(std::string_view text, std::string_view what, std::string_view url) {
  int v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || v < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("redis URL '{}': the {} '{}' is not a number", url, what, text));
  }
  return v;
}

// The URL's %XX escapes decoded (a query value's '@', '&', '%'; a
// password's '@', ':', '/'). `what` names the text in an error, so that a
// password is never echoed.
std::string percent_decoded(std::string_view text, std::string_view url, std::string_view what) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    int v = -1;
    if (i + 2 < text.size()) {
      const auto [end, ec] = std::from_chars(text.data() + i + 1, text.data() + i + 3, v, 16);
      if (ec != std::errc() || end != text.data() + i + 3) v = -1;
    }
    if (v < 0) {
      throw Error(
          ErrorCode::kInvalidArgument,
          fmt::format("redis URL '{}': '%' in {} is not followed by two hex digits", url, what));
    }
    out += static_cast<char>(v);
    i += 2;
  }
  return out;
}

// The query of a rediss:// URL into url's TLS files.
void parse_query(std::string_view query, Url& url, std::string_view shown) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const size_t eq = pair.find('=');
    const std::string_view name = pair.substr(0, eq);
    const std::string value =
        eq == std::string_view::npos
            ? std::string()
            : percent_decoded(pair.substr(eq + 1), shown, fmt::format("'{}'", pair.substr(eq + 1)));
    std::string* field = name == "cacert" ? &url.ca_file
                         : name == "cert" ? &url.cert_file
                         : name == "key"  ? &url.key_file
                                          : nullptr;
    if (field == nullptr) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': unknown parameter '{}' (rediss:// takes cacert, "
                              "cert and key, each a file)",
                              shown, name));
    }
    if (!url.tls) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': '{}' is for TLS: write rediss://", shown, name));
    }
    if (value.empty()) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': '{}' names no file", shown, name));
    }
    *field = value;
  }
  if (url.cert_file.empty() != url.key_file.empty()) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("redis URL '{}': a client certificate needs both cert= and key=", shown));
  }
}

// The URL as messages may show it: after the userinfo's first ':', all up
// to the authority's last '@' masked. Where a '/', '?' or '#' in a password
// cut the authority short (what follows its ':' is no port), up to the
// URL's last '@'. Never the password, however the URL is malformed.
std::string shown_url(std::string_view text) {
  const size_t scheme_end = text.find("://");
  if (scheme_end == std::string_view::npos) return std::string(text);
  const size_t from = scheme_end + 3;
  const size_t end = std::min(text.find_first_of("/?#", from), text.size());
  const std::string_view authority = text.substr(from, end - from);
  size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    at += from;
  } else {
    const size_t bracket = !authority.empty() && authority.front() == '[' ? authority.find(']') : 0;
    const size_t colon = authority.find(':', bracket == std::string_view::npos ? 0 : bracket);
    const std::string_view after =
        colon == std::string_view::npos ? std::string_view() : authority.substr(colon + 1);
    const bool port = after.find_first_not_of("0123456789") == std::string_view::npos;
    if (colon == std::string_view::npos || port) return std::string(text);
    at = text.rfind('@');
  }
  const size_t colon = text.find(':', from);
  if (at == std::string_view::npos || at < from || colon >= at) return std::string(text);
  return std::string(text.substr(0, colon + 1)) + "***" + std::string(text.substr(at));
}

// What `host` is: AF_INET, AF_INET6, or AF_UNSPEC for a name.
int host_family(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return AF_INET;
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return AF_INET6;
  return AF_UNSPEC;
}

// OpenSSL's queued errors as one text, the queue emptied.
std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? std::string("no reason given") : out;
}

// One command on a context: its reply, or nothing with `reason` set (the
// context is unusable then).
std::optional<Reply> send(redisContext* ctx, const std::vector<std::string>& args, double timeout_s,
                          std::string& reason) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  void* raw = redisCommandArgv(ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
  if (raw == nullptr) {
    reason = ctx->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)
                 ? fmt::format("no reply within {:.1f} s", timeout_s)
                 : std::string(ctx->errstr);
    return std::nullopt;
  }
  auto* reply = static_cast<redisReply*>(raw);
  Reply out = to_value(reply);
  freeReplyObject(reply);
  return out;
}

}  // namespace

std::string Url::address() const {
  std::string out = tls ? "rediss://" : "redis://";
  if (!user.empty()) out += user + "@";
  out += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  out += fmt::format(":{}", port);
  if (db != 0) out += fmt::format("/{}", db);
  return out;
}

bool Url::clear_text_off_host() const {
  return !tls && !is_loopback_host(host);
}

namespace {

// The URL after its scheme ("redis://", or "rediss://", which sets url.tls).
std::string_view after_scheme(std::string_view text, Url& url, const std::string& shown) {
  if (text.substr(0, 8) == "redis://") return text.substr(8);
  if (text.substr(0, 9) == "rediss://") {
    url.tls = true;
    return text.substr(9);
  }
  throw Error(ErrorCode::kInvalidArgument,
              fmt::format("redis URL '{}' must start with redis:// or, for TLS, rediss:// "
                          "(redis[s]://[user[:password]@]host[:port][/db])",
                          shown));
}

// The authority's userinfo (what comes before its first '@') into url.user
// and url.password; returns the rest, the host and port.
std::string_view take_userinfo(std::string_view authority, Url& url, const std::string& shown) {
  const size_t at = authority.find('@');
  if (at == std::string_view::npos) return authority;
  const std::string_view userinfo = authority.substr(0, at);
  authority = authority.substr(at + 1);
  if (authority.find('@') != std::string_view::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("redis URL '{}': more than one '@' before the host: write an '@' "
                            "in the user name or password as %40",
                            shown));
  }
  const size_t colon = userinfo.find(':');
  url.user = percent_decoded(userinfo.substr(0, colon), shown, "the user name");
  if (colon != std::string_view::npos)
    url.password = percent_decoded(userinfo.substr(colon + 1), shown, "the password");
  return authority;
}

// What follows the authority: "?query" and "/db" (a "#fragment" is refused).
void parse_path_and_query(std::string_view tail, Url& url, const std::string& shown) {
  if (tail.find('#') != std::string_view::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("redis URL '{}': a '#' fragment means nothing to Redis (write a '#' "
                            "in a password as %23)",
                            shown));
  }
  if (const size_t q = tail.find('?'); q != std::string_view::npos) {
    parse_query(tail.substr(q + 1), url, shown);
    tail = tail.substr(0, q);
  }
  if (!tail.empty()) {  // "/db"
    const std::string_view db = tail.substr(1);
    if (!db.empty()) url.db = parse_int(db, "database", shown);
  }
}

// "host", "host:port", "[v6]" or "[v6]:port" into url.host and url.port.
void parse_host_and_port(std::string_view authority, Url& url, const std::string& shown) {
  std::optional<std::string_view> port;  // set: a ':' was given
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': an IPv6 address lacks its ']'", shown));
    }
    url.host = std::string(authority.substr(1, close - 1));
    if (close + 1 < authority.size()) {
      if (authority[close + 1] != ':')
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("redis URL '{}': expected ':port' after the address", shown));
      port = authority.substr(close + 2);
    }
  } else if (const size_t colon = authority.rfind(':'); colon != std::string_view::npos) {
    url.host = std::string(authority.substr(0, colon));
    port = authority.substr(colon + 1);
  } else {
    url.host = std::string(authority);
  }
  if (url.host.empty())
    throw Error(ErrorCode::kInvalidArgument, fmt::format("redis URL '{}' has no host", shown));
  if (port && port->empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("redis URL '{}': the port after ':' is empty (leave out the ':' for "
                            "6379)",
                            shown));
  }
  if (port) {
    url.port = parse_int(*port, "port", shown);
    if (url.port < 1 || url.port > 65535) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': port {} is outside 1-65535", shown, url.port));
    }
  }
}

}  // namespace

Url parse_url(std::string_view text) {
  Url url;
  const std::string shown = shown_url(text);
  const std::string_view rest = after_scheme(text, url, shown);
  // RFC 3986: the authority ends at the first '/', '?' or '#'; its userinfo
  // is what comes before its first '@'.
  const size_t authority_end = std::min(rest.find_first_of("/?#"), rest.size());
  const std::string_view authority = take_userinfo(rest.substr(0, authority_end), url, shown);
  parse_path_and_query(rest.substr(authority_end), url, shown);
  parse_host_and_port(authority, url, shown);
  if (!url.user.empty() && url.password.empty()) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("redis URL '{}' names user '{}' without a password "
                            "(redis://user:password@host:port)",
                            shown, url.user));
  }
  return url;
}

Url resolve_url(std::string_view explicit_url) {
  if (!explicit_url.empty()) return parse_url(explicit_url);
  if (const char* env = std::getenv("SWARMKV_REDIS"); env != nullptr && *env != '\0') {
    try {
      return parse_url(env);
    } catch (const Error& e) {
      throw Error(e.code(), "$SWARMKV_REDIS: " + e.message());
    }
  }
  throw Error(ErrorCode::kInvalidArgument,
              "no Redis server given: pass --redis redis://[user:password@]host:port or set "
              "$SWARMKV_REDIS");
}

struct Client::Connection {
  redisContext* ctx = nullptr;
  ~Connection() {
    if (ctx != nullptr) redisFree(ctx);  // frees its SSL too (hiredis owns it once connected)
  }
};

struct Client::Tls {
  struct Free {
    void operator()(SSL_CTX* c) const noexcept { SSL_CTX_free(c); }
  };
  // A member, so that a constructor that throws still frees it.
  std::unique_ptr<SSL_CTX, Free> owned;

  // Peer verification on (the given CAs or the system's), TLS 1.2 at least,
  // and the client certificate when the URL names one.
  explicit Tls(const Url& url) : owned(SSL_CTX_new(TLS_client_method())) {
    SSL_CTX* ctx = owned.get();
    const auto refuse = [&](const std::string& what) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: {}: {}", url.address(), what, openssl_errors()));
    };
    if (ctx == nullptr) refuse("cannot set up TLS");
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    if (!url.ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(ctx, url.ca_file.c_str(), nullptr) != 1)
        refuse(fmt::format("cannot load the CA file '{}' (cacert=)", url.ca_file));
    } else if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
      refuse("cannot load the system's CAs (give cacert=FILE)");
    }
    if (!url.cert_file.empty()) {
      if (SSL_CTX_use_certificate_chain_file(ctx, url.cert_file.c_str()) != 1)
        refuse(fmt::format("cannot load the client certificate '{}' (cert=)", url.cert_file));
      if (SSL_CTX_use_PrivateKey_file(ctx, url.key_file.c_str(), SSL_FILETYPE_PEM) != 1)
        refuse(fmt::format("cannot load the private key '{}' (key=)", url.key_file));
      if (SSL_CTX_check_private_key(ctx) != 1)
        refuse(fmt::format("the key '{}' is not the certificate's", url.key_file));
    }
  }
  // The handshake on a connected context: the certificate must verify and
  // name the URL's host (DNS name or address). Throws kUnauthenticated when
  // it does not, kIo when the handshake fails otherwise.
  void handshake(redisContext* c, const Url& url, double timeout_s) const {
    SSL* ssl = SSL_new(owned.get());
    if (ssl == nullptr) {
      throw Error(ErrorCode::kIo,
                  fmt::format("{}: cannot connect: TLS: {}", url.address(), openssl_errors()));
    }
    X509_VERIFY_PARAM* param = SSL_get0_param(ssl);
    if (host_family(url.host) != AF_UNSPEC) {
      X509_VERIFY_PARAM_set1_ip_asc(param, url.host.c_str());
    } else {
      // SNI (SSL_set_tlsext_host_name, a macro with a C cast).
      SSL_ctrl(ssl, SSL_CTRL_SET_TLSEXT_HOSTNAME, TLSEXT_NAMETYPE_host_name,
               const_cast<char*>(url.host.c_str()));
      X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      X509_VERIFY_PARAM_set1_host(param, url.host.c_str(), url.host.size());
    }
    ERR_clear_error();
    if (redisInitiateSSL(c, ssl) == REDIS_OK) return;  // c owns ssl now
    const bool timed_out = errno == EAGAIN || errno == EWOULDBLOCK;
    const long verify = SSL_get_verify_result(ssl);
    const std::string reason = c->errstr;
    SSL_free(ssl);
    ERR_clear_error();
    if (verify != X509_V_OK) {
      throw Error(ErrorCode::kUnauthenticated,
                  fmt::format("{}: the server's certificate does not verify: {}{}", url.address(),
                              X509_verify_cert_error_string(verify),
                              url.ca_file.empty() ? " (checked against the system's CAs; "
                                                    "cacert=FILE names others)"
                                                  : fmt::format(" (CAs: {})", url.ca_file)));
    }
    throw Error(
        ErrorCode::kIo,
        fmt::format("{}: cannot connect: TLS handshake failed: {}", url.address(),
                    timed_out ? fmt::format("no answer within {:.1f} s", timeout_s) : reason));
  }
};

Client::Client(Url url, ClientOptions options) : url_(std::move(url)), options_(options) {
  if (url_.tls) tls_ = std::make_unique<Tls>(url_);
  connect();
}

Client::~Client() = default;

void Client::connect() {
  auto conn = std::make_unique<Connection>();
  conn->ctx =
      redisConnectWithTimeout(url_.host.c_str(), url_.port, to_timeval(options_.connect_timeout_s));
  if (conn->ctx == nullptr) {
    throw Error(ErrorCode::kIo, fmt::format("{}: cannot connect: out of memory", url_.address()));
  }
  if (conn->ctx->err != 0) {
    throw Error(ErrorCode::kIo,
                fmt::format("{}: cannot connect: {}", url_.address(), conn->ctx->errstr));
  }
  if (tls_) {  // part of connecting: under the connect timeout
    redisSetTimeout(conn->ctx, to_timeval(options_.connect_timeout_s));
    tls_->handshake(conn->ctx, url_, options_.connect_timeout_s);
  }
  redisSetTimeout(conn->ctx, to_timeval(options_.command_timeout_s));
  // AUTH, SELECT and PING on the new context, never through try_command: a
  // server that accepts and then drops every connection must fail this
  // attempt, not start a reconnect loop inside the reconnect loop.
  const auto handshake = [&](const std::vector<std::string>& args, const std::string& what) {
    std::string reason;
    const std::optional<Reply> r = send(conn->ctx, args, options_.command_timeout_s, reason);
    if (!r) {
      throw Error(ErrorCode::kIo,
                  fmt::format("{}: cannot connect: {}: {}{}", url_.address(), what, reason,
                              !url_.tls ? " (if the server's port speaks TLS, write rediss://)"
                              : url_.cert_file.empty()
                                  ? " (if the server asks for a client certificate, give "
                                    "cert=FILE&key=FILE)"
                                  : ""));
    }
    if (!r->is_error()) return;
    if (r->str.find("NOAUTH") != std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: the server requires a password: give it in the URL, "
                              "redis://[user:]PASSWORD@host:port ({})",
                              url_.address(), r->str));
    }
    throw Error(what == "AUTH" ? ErrorCode::kInvalidArgument : ErrorCode::kIo,
                fmt::format("{}: {} refused: {}", url_.address(), what, r->str));
  };
  if (!url_.password.empty()) {
    handshake(url_.user.empty() ? std::vector<std::string>{"AUTH", url_.password}
                                : std::vector<std::string>{"AUTH", url_.user, url_.password},
              "AUTH");
  }
  if (url_.db != 0) handshake({"SELECT", std::to_string(url_.db)}, "SELECT");
  handshake({"PING"}, "PING");
  conn_ = std::move(conn);
}

void Client::reconnect(const std::string& command, const std::string& reason) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const auto elapsed_s = [&] {
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  const auto stopped = [&] { return options_.stop != nullptr && options_.stop->load(); };
  double wait_s = 0.1;
  std::string last = reason;
  int attempt = 0;
  bool said = false;
  while (!stopped()) {
    // Sleeps in slices, so that a stop is seen within 0.1 s.
    const double left_s = options_.reconnect_for_s - elapsed_s();
    if (left_s <= 0) break;
    const double nap_s = std::min(wait_s, left_s);
    for (double slept = 0; slept < nap_s && !stopped(); slept += 0.1)
      std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.1, nap_s - slept)));
    if (stopped()) break;
    wait_s = std::min(wait_s * 2, 2.0);
    ++attempt;
    try {
      connect();
      ++reconnects_;
      log_warn("{}: connection re-established after {:.1f} s (attempt {}); it was lost: {}",
               url_.address(), elapsed_s(), attempt, reason);
      return;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kInvalidArgument || e.code() == ErrorCode::kUnauthenticated) throw;
      last = e.message();
    }
    if (!said && elapsed_s() >= 2) {  // an outage, not a blip: say so once
      said = true;
      log_warn("{}: connection lost ({}); reconnecting{}", url_.address(), reason,
               std::isfinite(options_.reconnect_for_s)
                   ? fmt::format(" for up to {:.0f} s", options_.reconnect_for_s)
                   : std::string(" until it is back"));
    }
  }
  conn_.reset();
  throw Error(ErrorCode::kIo,
              fmt::format("{}: {}: connection lost ({}); {} in {:.1f} s of reconnecting ({} "
                          "attempts), the last: {}",
                          url_.address(), command, reason, stopped() ? "stopped" : "not back",
                          elapsed_s(), attempt, last));
}

Reply Client::try_command(const std::vector<std::string>& args) {
  const std::string name = args.empty() ? std::string("(empty)") : args.front();
  for (int pass = 0;; ++pass) {
    std::string reason = "not connected";
    if (conn_) {
      if (std::optional<Reply> r = send(conn_->ctx, args, options_.command_timeout_s, reason))
        return *std::move(r);
      conn_.reset();  // a context that failed once is unusable (hiredis)
    }
    if (pass > 0) {
      throw Error(ErrorCode::kIo, fmt::format("{}: {}: {}", url_.address(), name, reason));
    }
    reconnect(name, reason);
  }
}

Reply Client::command(const std::vector<std::string>& args) {
  Reply r = try_command(args);
  if (r.is_error()) {
    throw Error(ErrorCode::kIo, fmt::format("{}: {}: {}", url_.address(),
                                            args.empty() ? std::string() : args.front(), r.str));
  }
  return r;
}

}  // namespace swarmkv::redis
