#include "server/request_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>

#include <fmt/format.h>

#include "swarmkv/host.h"

namespace swarmkv::server {
namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The name of a Host header ("name", "name:port", "[v6]:port"): lower
// case, brackets and a trailing dot gone.
std::string host_name(std::string_view host) {
  std::string_view name = host;
  if (name.starts_with('[')) {
    const size_t close = name.find(']');
    if (close == name.npos) return "";  // names nothing
    name = name.substr(1, close - 1);
  } else if (const size_t colon = name.find(':');
             colon != name.npos && name.find(':', colon + 1) == name.npos) {
    name = name.substr(0, colon);
  }
  if (name.ends_with('.')) name.remove_suffix(1);
  return lower(name);
}

// An IPv4 or IPv6 address as 16 bytes (IPv4 as ::ffff:a.b.c.d), or nullopt
// for a name.
std::optional<std::array<unsigned char, 16>> address(const std::string& text) {
  std::array<unsigned char, 16> out{};
  in_addr v4{};
  if (::inet_pton(AF_INET, text.c_str(), &v4) == 1) {
    out[10] = out[11] = 0xff;
    std::memcpy(out.data() + 12, &v4, 4);
    return out;
  }
  in6_addr v6{};
  if (::inet_pton(AF_INET6, text.c_str(), &v6) == 1) {
    std::memcpy(out.data(), &v6, 16);
    return out;
  }
  return std::nullopt;
}

std::string this_machine() {
  std::array<char, 256> name{};
  return ::gethostname(name.data(), name.size() - 1) == 0 ? lower(name.data()) : std::string();
}

}  // namespace

RequestGuard::RequestGuard(std::string bound, std::vector<std::string> allow_hosts,
                           std::vector<std::string> allow_origins) {
  names_ = {"localhost", host_name(bound), this_machine()};
  for (const std::string& h : allow_hosts) names_.push_back(host_name(h));
  std::erase(names_, std::string());  // no Host names nothing
  for (const std::string& o : allow_origins) {
    std::string_view origin = trim(o);
    if (origin.ends_with('/')) origin.remove_suffix(1);
    origins_.push_back(lower(origin));
  }
}

bool RequestGuard::host_allowed(std::string_view name, std::string_view local_addr) const {
  const std::string n(name);
  if (std::find(names_.begin(), names_.end(), n) != names_.end()) return true;
  const auto ip = address(n);
  return ip && (is_loopback_host(n) || ip == address(host_name(local_addr)));
}

std::optional<Refusal> RequestGuard::check(std::string_view host, std::string_view origin,
                                           std::string_view local_addr) const {
  host = trim(host);
  origin = trim(origin);
  if (!host.empty() && !host_allowed(host_name(host), local_addr)) {
    return Refusal{
        "forbidden_host",
        fmt::format("Host '{}' is not this server's name or address: a page whose DNS name was "
                    "pointed at this server (DNS rebinding) must not use it or read its runs; "
                    "serve with --allow-host {} to answer to that name",
                    host, host_name(host))};
  }
  if (origin.empty()) return std::nullopt;
  const std::string o = lower(origin);
  const std::string h = lower(host);
  if ((!h.empty() && (o == "http://" + h || o == "https://" + h)) ||
      std::find(origins_.begin(), origins_.end(), o) != origins_.end()) {
    return std::nullopt;
  }
  return Refusal{"forbidden_origin",
                 fmt::format("Origin '{}' is not this server ('{}'): a page on another site "
                             "must not use it; serve with --allow-origin {} to let that site "
                             "in",
                             origin, host, origin)};
}

bool is_json_content_type(std::string_view content_type) {
  const std::string_view media = trim(content_type.substr(0, content_type.find(';')));
  return lower(media) == "application/json";
}

}  // namespace swarmkv::server
