// What a request must carry before `swarmkv serve` routes it, so that a web
// page the operator opens cannot drive the server or read its runs:
//
// - Host: the server's own name or address. A page on evil.example whose
//   DNS name is pointed at 127.0.0.1 after it loaded (DNS rebinding) is
//   same-origin with the server in the browser's eyes, so it could read
//   every kept run; its requests still say "Host: evil.example".
// - Origin, when a browser sends one: this server's own (scheme and the
//   Host it was asked by), or one allowed by name. A page elsewhere can
//   POST to any server without asking first (a "simple" request: a form,
//   or fetch with Content-Type text/plain), and says where it comes from.
// - Content-Type application/json on POST routes: a browser asks the
//   server first (a CORS preflight, which this server never grants) before
//   it sends JSON to another site, never before text/plain or a form.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace swarmkv::server {

// A request refused: `code` is the error body's code ("forbidden_host",
// "forbidden_origin"), `message` says why and what to do.
struct Refusal {
  std::string code;
  std::string message;
};

// The Host and Origin rules. Thread-safe (immutable after construction).
class RequestGuard {
 public:
  // `bound`: the address or name the server listens on (--host);
  // `allow_hosts`: more names a Host may carry (--allow-host; any case);
  // `allow_origins`: more origins a page may come from (--allow-origin,
  // "scheme://host[:port]"; any case, a trailing '/' ignored).
  RequestGuard(std::string bound, std::vector<std::string> allow_hosts,
               std::vector<std::string> allow_origins);

  // Whether a request with these headers ("" for one absent) that arrived
  // at local address `local_addr` may go on. A Host is allowed when its
  // name (the port aside) is "localhost", this machine's host name, the
  // bound name, one of allow_hosts, or an address that is loopback or the
  // one the connection arrived at; no Host at all (HTTP/1.0) too. An
  // Origin is allowed when absent, when it is "http://" or "https://"
  // followed by the request's Host, or when it is one of allow_origins;
  // "null" (a sandboxed page, a file) is refused.
  std::optional<Refusal> check(std::string_view host, std::string_view origin,
                               std::string_view local_addr) const;

 private:
  bool host_allowed(std::string_view name, std::string_view local_addr) const;

  std::vector<std::string> names_;    // lower case: localhost, this machine's, bound, allowed
  std::vector<std::string> origins_;  // lower case, no trailing '/'
};

// Whether a Content-Type header names JSON: "application/json" in any
// case, parameters ("; charset=utf-8") allowed.
bool is_json_content_type(std::string_view content_type);

}  // namespace swarmkv::server
