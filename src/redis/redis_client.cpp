// hiredis behind swarmkv::redis::Client: connection, AUTH, timeouts,
// bounded reconnects, replies copied into values.
#include "swarmkv/redis.h"

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include "swarmkv/error.h"
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

}  // namespace

std::string Url::address() const {
  std::string out = "redis://";
  if (!user.empty()) out += user + "@";
  out += host.find(':') != std::string::npos ? "[" + host + "]" : host;
  out += fmt::format(":{}", port);
  if (db != 0) out += fmt::format("/{}", db);
  return out;
}

Url parse_url(std::string_view text) {
  constexpr std::string_view kScheme = "redis://";
  Url url;
  // The URL as messages may show it: without what follows a ':' in the userinfo.
  std::string shown(text);
  const size_t at = text.rfind('@');
  if (at != std::string_view::npos &&
      text.substr(0, at).find(':', kScheme.size()) != std::string_view::npos) {
    shown = std::string(text.substr(0, text.substr(0, at).find(':', kScheme.size()))) + ":***" +
            std::string(text.substr(at));
  }
  if (text.substr(0, kScheme.size()) != kScheme) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("redis URL '{}' must start with redis:// (redis://[user[:password]@]"
                            "host[:port][/db]; rediss:// TLS is not supported)",
                            shown));
  }
  std::string_view rest = text.substr(kScheme.size());
  if (const size_t a = rest.rfind('@'); a != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, a);
    rest = rest.substr(a + 1);
    const size_t colon = userinfo.find(':');
    url.user = std::string(userinfo.substr(0, colon));
    if (colon != std::string_view::npos) url.password = std::string(userinfo.substr(colon + 1));
  }
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) url.db = parse_int(db, "database", shown);
    rest = rest.substr(0, slash);
  }
  std::string_view port;
  if (!rest.empty() && rest.front() == '[') {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': an IPv6 address lacks its ']'", shown));
    }
    url.host = std::string(rest.substr(1, close - 1));
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':')
        throw Error(ErrorCode::kInvalidArgument,
                    fmt::format("redis URL '{}': expected ':port' after the address", shown));
      port = rest.substr(close + 2);
    }
  } else if (const size_t colon = rest.rfind(':'); colon != std::string_view::npos) {
    url.host = std::string(rest.substr(0, colon));
    port = rest.substr(colon + 1);
  } else {
    url.host = std::string(rest);
  }
  if (url.host.empty())
    throw Error(ErrorCode::kInvalidArgument, fmt::format("redis URL '{}' has no host", shown));
  if (!port.empty()) {
    url.port = parse_int(port, "port", shown);
    if (url.port < 1 || url.port > 65535) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("redis URL '{}': port {} is outside 1-65535", shown, url.port));
    }
  }
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
    if (ctx != nullptr) redisFree(ctx);
  }
};

Client::Client(Url url, ClientOptions options) : url_(std::move(url)), options_(options) {
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
  redisSetTimeout(conn->ctx, to_timeval(options_.command_timeout_s));
  conn_ = std::move(conn);
  const auto handshake = [&](const std::vector<std::string>& args, const std::string& what) {
    const Reply r = try_command(args);
    if (!r.is_error()) return;
    if (r.str.rfind("NOAUTH", 0) == 0 || r.str.find("NOAUTH") != std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  fmt::format("{}: the server requires a password: give it in the URL, "
                              "redis://[user:]PASSWORD@host:port ({})",
                              url_.address(), r.str));
    }
    throw Error(what == "AUTH" ? ErrorCode::kInvalidArgument : ErrorCode::kIo,
                fmt::format("{}: {} refused: {}", url_.address(), what, r.str));
  };
  if (!url_.password.empty()) {
    handshake(url_.user.empty() ? std::vector<std::string>{"AUTH", url_.password}
                                : std::vector<std::string>{"AUTH", url_.user, url_.password},
              "AUTH");
  }
  if (url_.db != 0) handshake({"SELECT", std::to_string(url_.db)}, "SELECT");
  handshake({"PING"}, "PING");
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
      if (e.code() == ErrorCode::kInvalidArgument) throw;
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
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  const std::string name = args.empty() ? std::string("(empty)") : args.front();
  for (int pass = 0;; ++pass) {
    std::string reason = "not connected";
    if (conn_) {
      void* raw =
          redisCommandArgv(conn_->ctx, static_cast<int>(argv.size()), argv.data(), lens.data());
      if (raw != nullptr) {
        auto* reply = static_cast<redisReply*>(raw);
        Reply out = to_value(reply);
        freeReplyObject(reply);
        return out;
      }
      reason = conn_->ctx->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)
                   ? fmt::format("no reply within {:.1f} s", options_.command_timeout_s)
                   : std::string(conn_->ctx->errstr);
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
