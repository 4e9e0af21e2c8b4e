// The cluster key and what its signatures cover.
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "cluster/keys.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"

namespace swarmkv::cluster {
namespace {

constexpr size_t kMinKeyBytes = 16;

std::string hex(const unsigned char* bytes, size_t n) {
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) out += fmt::format("{:02x}", bytes[i]);
  return out;
}

// Each part as <length>:<bytes>, so that no two lists of parts read alike.
void append_part(std::string& out, std::string_view part) {
  out += std::to_string(part.size());
  out += ':';
  out += part;
}

}  // namespace

ClusterKey::ClusterKey(std::string secret) : secret_(std::move(secret)) {
  if (secret_.size() < kMinKeyBytes) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("a cluster key needs at least {} bytes (got {}); make one with: "
                            "openssl rand -hex 32 > cluster.key",
                            kMinKeyBytes, secret_.size()));
  }
}

ClusterKey ClusterKey::from_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw Error(ErrorCode::kNotFound, fmt::format("no cluster key file {}", path));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in && !in.eof()) throw Error(ErrorCode::kIo, fmt::format("cannot read {}", path));
  std::string secret = text.str();
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  try {
    return ClusterKey(std::move(secret));
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path, e.message()));
  }
}

ClusterKey ClusterKey::resolve(const std::string& file) {
  if (!file.empty()) return from_file(file);
  const char* env = std::getenv("SWARMKV_CLUSTER_KEY");
  if (env == nullptr || *env == '\0') return {};
  try {
    return ClusterKey(env);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("$SWARMKV_CLUSTER_KEY: {}", e.message()));
  }
}

std::string ClusterKey::sign(std::string_view message) const {
  if (secret_.empty()) return "";
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), secret_.data(), static_cast<int>(secret_.size()),
           reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac,
           &len) == nullptr) {
    throw Error(ErrorCode::kInternal, "HMAC-SHA256 failed");
  }
  return hex(mac, len);
}

std::string ClusterKey::id() const {
  return empty() ? std::string() : sign("swarmkv key id").substr(0, 16);
}

bool ClusterKey::verifies(std::string_view message, std::string_view signature) const {
  const std::string want = sign(message);
  return !want.empty() && signature.size() == want.size() &&
         CRYPTO_memcmp(want.data(), signature.data(), want.size()) == 0;
}

std::string sha256_hex(std::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "SHA-256 failed");
  }
  return hex(digest, len);
}

std::string entry_signed_text(const std::string& stream,
                              const std::map<std::string, std::string>& fields) {
  std::string out = "swarmkv stream entry\n";
  append_part(out, stream);
  for (const auto& [name, value] : fields) {
    if (name == keys::kSignatureField) continue;
    append_part(out, name);
    append_part(out, value);
  }
  return out;
}

std::vector<std::string> xadd(const ClusterKey& key, const std::string& stream, int64_t max_len,
                              const std::vector<std::pair<std::string, std::string>>& fields) {
  std::vector<std::string> command = {"XADD", stream, "MAXLEN", "~", std::to_string(max_len), "*"};
  std::map<std::string, std::string> signed_fields;
  for (const auto& [name, value] : fields) {
    command.push_back(name);
    command.push_back(value);
    signed_fields[name] = value;
  }
  if (!key.empty()) {
    command.emplace_back(keys::kSignatureField);
    command.push_back(key.sign(entry_signed_text(stream, signed_fields)));
  }
  return command;
}

namespace {

std::optional<std::string> refusal(const ClusterKey& key, const std::string& text,
                                   const std::string* signature) {
  if (key.empty()) return std::nullopt;
  if (signature == nullptr || signature->empty()) return "it is unsigned";
  // A signature is an HMAC-SHA256 in lower-case hex; anything else was cut
  // or garbled on its way, not made with another key.
  if (signature->size() != 64 ||
      signature->find_first_not_of("0123456789abcdef") != std::string::npos) {
    return fmt::format("its signature is malformed ({} characters; a signature is 64 hex digits)",
                       signature->size());
  }
  if (!key.verifies(text, *signature)) return "it is signed with another cluster key";
  return std::nullopt;
}

std::string json_signed_text(const std::string& where, const nlohmann::json& doc) {
  std::string out = "swarmkv document\n";
  append_part(out, where);
  append_part(out, doc.dump());
  return out;
}

}  // namespace

std::optional<std::string> entry_refusal(const ClusterKey& key, const std::string& stream,
                                         const StreamEntry& entry) {
  const auto it = entry.fields.find(keys::kSignatureField);
  return refusal(key, entry_signed_text(stream, entry.fields),
                 it == entry.fields.end() ? nullptr : &it->second);
}

void sign_json(const ClusterKey& key, const std::string& where, nlohmann::json& doc) {
  doc.erase(keys::kSignatureField);
  if (key.empty()) return;
  const std::string sig = key.sign(json_signed_text(where, doc));
  doc[keys::kSignatureField] = sig;
}

std::optional<std::string> json_refusal(const ClusterKey& key, const std::string& where,
                                        nlohmann::json& doc) {
  std::optional<std::string> sig;
  if (doc.is_object()) {
    if (const auto it = doc.find(keys::kSignatureField); it != doc.end() && it->is_string())
      sig = it->get<std::string>();
    doc.erase(keys::kSignatureField);
  }
  return refusal(key, json_signed_text(where, doc), sig ? &*sig : nullptr);
}

}  // namespace swarmkv::cluster
