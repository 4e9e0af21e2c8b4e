// The content-addressed disk store of snapshots and the model fingerprint
// cache.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <xxhash.h>

#include <nlohmann/json.hpp>

#include "swarmkv/log.h"
#include "swarmkv/paths.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kSuffix = ".swkv";
constexpr uint64_t kDefaultCacheMax = 4ull << 30;
constexpr auto kStaleTemporary = std::chrono::hours(1);

std::string sha256_of_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, fmt::format("cannot open '{}' to hash it", path));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> md(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!md || EVP_DigestInit_ex(md.get(), EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorCode::kInternal, "OpenSSL could not start a SHA-256");
  }
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const auto got = in.gcount();
    if (got > 0) EVP_DigestUpdate(md.get(), buf.data(), static_cast<size_t>(got));
  }
  if (in.bad()) throw Error(ErrorCode::kIo, fmt::format("reading '{}' to hash it failed", path));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(md.get(), digest, &n);
  std::string hex;
  for (unsigned int i = 0; i < n; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

bool is_temporary(const fs::path& p) {
  return p.filename().string().starts_with(".tmp-");
}

}  // namespace

std::string model_fingerprint(const std::string& gguf_path) {
  std::error_code ec;
  const fs::path abs = fs::absolute(gguf_path, ec);
  struct stat st {};
  if (::stat(gguf_path.c_str(), &st) != 0) {
    throw Error(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIo,
                fmt::format("cannot stat model '{}': {}", gguf_path, std::strerror(errno)));
  }
  const int64_t mtime_ns =
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  const fs::path dir = fs::path(cache_dir()) / "fingerprints";
  const fs::path entry =
      dir / fmt::format("{:016x}.json", XXH3_64bits(abs.c_str(), abs.native().size()));
  {
    std::ifstream in(entry);
    if (in) {
      try {
        const auto j = nlohmann::json::parse(in);
        if (j.at("path") == abs.string() && j.at("size") == static_cast<uint64_t>(st.st_size) &&
            j.at("mtime_ns") == mtime_ns) {
          return j.at("sha256").get<std::string>();
        }
      } catch (const nlohmann::json::exception&) {
        // A damaged cache entry: hash again and rewrite it.
      }
    }
  }
  const std::string sha = sha256_of_file(gguf_path);
  const nlohmann::json j = {{"path", abs.string()},
                            {"size", static_cast<uint64_t>(st.st_size)},
                            {"mtime_ns", mtime_ns},
                            {"sha256", sha}};
  fs::create_directories(dir, ec);
  std::random_device rd;
  const fs::path tmp = dir / fmt::format(".tmp-{}-{:08x}", ::getpid(), rd());
  {
    std::ofstream out(tmp);
    out << j.dump() << '\n';
  }
  fs::rename(tmp, entry, ec);  // a cache: failing to keep it costs only a rehash
  if (ec) fs::remove(tmp, ec);
  return sha;
}

uint64_t parse_byte_size(std::string_view text) {
  const auto bad = [&] {
    return Error(ErrorCode::kInvalidArgument,
                 fmt::format("'{}' is not a size (bytes, or a number with K, M, G or T)", text));
  };
  if (text.empty()) throw bad();
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (UINT64_MAX - 9) / 10) throw bad();
    value = value * 10 + static_cast<uint64_t>(text[i] - '0');
  }
  if (i == 0) throw bad();
  std::string_view unit = text.substr(i);
  if (!unit.empty() && (unit.back() == 'B' || unit.back() == 'b')) unit.remove_suffix(1);
  if (!unit.empty() && (unit.back() == 'i')) unit.remove_suffix(1);
  int shift = 0;
  if (unit.empty()) {
    shift = 0;
  } else if (unit.size() == 1) {
    switch (unit[0]) {
      case 'K':
      case 'k':
        shift = 10;
        break;
      case 'M':
      case 'm':
        shift = 20;
        break;
      case 'G':
      case 'g':
        shift = 30;
        break;
      case 'T':
      case 't':
        shift = 40;
        break;
      default:
        throw bad();
    }
  } else {
    throw bad();
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) throw bad();
  return value << shift;
}

uint64_t default_snapshot_cache_max() {
  const char* env = std::getenv("SWARMKV_SNAPSHOT_CACHE_MAX");
  if (env == nullptr || *env == '\0') return kDefaultCacheMax;
  try {
    return parse_byte_size(env);
  } catch (const Error& e) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("SWARMKV_SNAPSHOT_CACHE_MAX: {}", e.message()));
  }
}

SnapshotStore::SnapshotStore(std::string dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes > 0 ? max_bytes : default_snapshot_cache_max()) {}

std::string snapshot_store_dir(const std::string& dir) {
  return dir.empty() ? (fs::path(cache_dir()) / "snapshots").string() : dir;
}

SnapshotStore SnapshotStore::open_default() {
  return SnapshotStore(snapshot_store_dir());
}

std::string SnapshotStore::path_of(const std::string& key) const {
  return (fs::path(dir_) / (key + std::string(kSuffix))).string();
}

std::vector<SnapshotStore::Entry> SnapshotStore::list() const {
  return scan(/*read_headers=*/true);
}

std::vector<SnapshotStore::Entry> SnapshotStore::scan(bool read_headers) const {
  std::vector<Entry> out;
  std::error_code ec;
  for (const fs::directory_entry& d : fs::directory_iterator(dir_, ec)) {
    const fs::path& p = d.path();
    if (is_temporary(p) || p.extension() != kSuffix) continue;
    Entry e;
    e.key = p.stem().string();
    e.path = p.string();
    struct stat st {};
    if (::stat(e.path.c_str(), &st) != 0) continue;  // removed meanwhile
    e.bytes = static_cast<uint64_t>(st.st_size);
    e.last_used_unix = st.st_mtim.tv_sec;
    if (read_headers) {
      try {
        e.header = read_snapshot_header(e.path);
      } catch (const Error& err) {
        if (err.code() == ErrorCode::kNotFound) continue;  // removed meanwhile
        e.error = err.value();
      }
    }
    out.push_back(std::move(e));
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.last_used_unix != b.last_used_unix ? a.last_used_unix > b.last_used_unix
                                                : a.key < b.key;
  });
  return out;
}

std::optional<SnapshotStore::Match> SnapshotStore::best_match(const SnapshotBinding& binding,
                                                              std::span<const Token> tokens,
                                                              size_t min_common,
                                                              std::vector<Entry>* bad) const {
  const std::string exact = snapshot_key(binding, tokens);
  std::optional<Match> best;
  for (Entry& e : list()) {
    if (!e.header) {
      if (bad != nullptr) bad->push_back(std::move(e));
      continue;
    }
    if (e.header->meta.binding != binding) continue;
    const size_t common = common_prefix(e.header->meta.tokens, tokens);
    if (common < min_common || common == 0) continue;
    const bool better =
        !best || (e.key == exact) || (best->entry.key != exact && common > best->common_tokens);
    if (better) best = Match{std::move(e), common};
  }
  return best;
}

std::string SnapshotStore::publish(const SnapshotMeta& meta, std::span<const uint8_t> payload) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    throw Error(ErrorCode::kIo,
                fmt::format("cannot create the snapshot store '{}': {}", dir_, ec.message()));
  }
  const std::string path = path_of(snapshot_key(meta.binding, meta.tokens));
  write_snapshot(path, meta, payload);
  const GcReport r = evict(max_bytes_, path);
  if (r.bytes_kept > max_bytes_) {
    log_warn("snapshot store: the new snapshot alone ({} bytes) is above the cap {} bytes",
             r.bytes_kept, max_bytes_);
  }
  return path;
}

std::string SnapshotStore::adopt(const std::string& key, std::span<const uint8_t> file) {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) {
    throw Error(ErrorCode::kIo,
                fmt::format("cannot create the snapshot store '{}': {}", dir_, ec.message()));
  }
  const std::string path = path_of(key);
  // Verified in memory: a damaged file never enters the store.
  try {
    const SnapshotHeader header = verify_snapshot(file, path);
    if (snapshot_key(header.meta.binding, header.meta.tokens) != key) {
      throw Error(ErrorCode::kCorruption,
                  fmt::format("the snapshot received for key {} is the snapshot of key {}", key,
                              snapshot_key(header.meta.binding, header.meta.tokens)));
    }
  } catch (const Error& e) {
    throw Error(ErrorCode::kCorruption, fmt::format("snapshot {}: {}", key, e.message()));
  }
  write_snapshot_bytes(path, file);
  evict(max_bytes_, path);
  return path;
}

SnapshotStore::GcReport SnapshotStore::evict(uint64_t max_bytes, const std::string& keep) const {
  GcReport report;
  const std::vector<Entry> entries = scan(/*read_headers=*/false);
  for (const Entry& e : entries) report.bytes_kept += e.bytes;
  for (auto it = entries.rbegin(); it != entries.rend() && report.bytes_kept > max_bytes; ++it) {
    if (it->path == keep || !remove_path(it->path)) continue;
    log_info("snapshot store: evicted {} ({} bytes, least recently used; cap {} bytes)", it->key,
             it->bytes, max_bytes);
    ++report.entries_removed;
    report.bytes_freed += it->bytes;
    report.bytes_kept -= it->bytes;
  }
  return report;
}

void SnapshotStore::touch(const std::string& path) const {
  std::error_code ec;
  fs::last_write_time(path, fs::file_time_type::clock::now(), ec);
}

bool SnapshotStore::remove_path(const std::string& path) const {
  std::error_code ec;
  return fs::remove(path, ec);
}

SnapshotStore::GcReport SnapshotStore::gc(uint64_t max_bytes) const {
  GcReport report;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const fs::directory_entry& d : fs::directory_iterator(dir_, ec)) {
    if (!is_temporary(d.path())) continue;
    const auto age = now - d.last_write_time(ec);
    if (!ec && age > kStaleTemporary) {
      const uint64_t bytes = d.file_size(ec);
      if (fs::remove(d.path(), ec)) {
        ++report.temporaries_removed;
        report.bytes_freed += bytes;
      }
    }
  }
  const GcReport evicted = evict(max_bytes, /*keep=*/{});
  report.entries_removed = evicted.entries_removed;
  report.bytes_freed += evicted.bytes_freed;
  report.bytes_kept = evicted.bytes_kept;
  return report;
}

std::string_view to_string(SnapshotSource source) noexcept {
  switch (source) {
    case SnapshotSource::kPrefill:
      return "prefill";
    case SnapshotSource::kCache:
      return "cache";
    case SnapshotSource::kFile:
      return "file";
    case SnapshotSource::kRedis:
      return "redis";
  }
  return "unknown";
}

}  // namespace swarmkv
