// The snapshot bus: a snapshot file in Redis as fixed-size chunks and a
// manifest written last (SET NX).
#include <chrono>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "cluster/keys.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"

namespace swarmkv::cluster {
namespace {

std::string chunk_key(const Manifest& m, size_t i) {
  return fmt::format("{}:{}:{}", keys::snapshot(m.key), m.upload, i);
}

// What a manifest's signature covers: the manifest without it.
std::string manifest_signed_text(Manifest m) {
  m.sig.clear();
  return "swarmkv manifest\n" + manifest_to_json(m);
}

// find_snapshot, but a manifest that does not parse or is refused is
// nullopt (a publisher replacing it has nothing of it to clean up).
std::optional<Manifest> find_snapshot_or_damaged(redis::Client& redis, const std::string& key,
                                                 const ClusterKey& cluster_key) {
  try {
    return find_snapshot(redis, key, cluster_key);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kCorruption && e.code() != ErrorCode::kUnauthenticated) throw;
    return std::nullopt;
  }
}

}  // namespace

std::string manifest_to_json(const Manifest& m) {
  nlohmann::json j{{"key", m.key},
                   {"upload", m.upload},
                   {"bytes", m.bytes},
                   {"chunk_bytes", m.chunk_bytes},
                   {"chunk_xxh3", m.chunk_xxh3},
                   {"producer", m.producer},
                   {"created_unix", m.created_unix}};
  if (!m.chunk_sha256.empty()) j["chunk_sha256"] = m.chunk_sha256;
  if (!m.sig.empty()) j[keys::kSignatureField] = m.sig;
  return j.dump();
}

Manifest manifest_from_json(std::string_view text, const std::string& key) {
  const auto damaged = [&](const std::string& why) {
    return Error(ErrorCode::kCorruption,
                 fmt::format("the manifest of snapshot {} is damaged: {}", key, why));
  };
  Manifest m;
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    m.key = j.at("key").get<std::string>();
    m.upload = j.at("upload").get<std::string>();
    m.bytes = j.at("bytes").get<uint64_t>();
    m.chunk_bytes = j.at("chunk_bytes").get<uint64_t>();
    m.chunk_xxh3 = j.at("chunk_xxh3").get<std::vector<uint64_t>>();
    m.producer = j.value("producer", "");
    m.created_unix = j.value("created_unix", int64_t{0});
    if (j.contains("chunk_sha256"))
      m.chunk_sha256 = j.at("chunk_sha256").get<std::vector<std::string>>();
    if (j.contains(keys::kSignatureField)) m.sig = j.at(keys::kSignatureField).get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    throw damaged(e.what());
  }
  const uint64_t expect = m.chunk_bytes == 0 ? 0 : (m.bytes + m.chunk_bytes - 1) / m.chunk_bytes;
  // A chunk is one Redis string, which holds at most 512 MiB.
  if (m.key != key || m.chunk_bytes == 0 || m.chunk_bytes > (uint64_t{512} << 20) ||
      m.chunk_xxh3.size() != expect ||
      (!m.chunk_sha256.empty() && m.chunk_sha256.size() != expect)) {
    throw damaged(fmt::format(
        "its key, chunk size or chunk count is inconsistent ({} bytes in {} chunks of {})", m.bytes,
        m.chunk_xxh3.size(), m.chunk_bytes));
  }
  return m;
}

PublishReport publish_snapshot(redis::Client& redis, const std::string& key,
                               std::span<const uint8_t> file, const BusOptions& options,
                               Publish mode) {
  if (options.chunk_bytes == 0 || options.ttl_s < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("snapshot bus: chunk_bytes must be >= 1 and ttl_s >= 1 (got {}, {})",
                            options.chunk_bytes, options.ttl_s));
  }
  const Stopwatch w;
  Manifest m;
  m.key = key;
  std::random_device rd;
  m.upload = fmt::format("{:08x}{:08x}", rd(), rd());
  m.bytes = file.size();
  m.chunk_bytes = options.chunk_bytes;
  m.producer = std::string("swarmkv ") + SWARMKV_VERSION;
  m.created_unix = unix_now();
  const std::string ttl = std::to_string(options.ttl_s);
  for (uint64_t at = 0; at < file.size(); at += options.chunk_bytes) {
    const std::span<const uint8_t> chunk =
        file.subspan(at, std::min<uint64_t>(options.chunk_bytes, file.size() - at));
    m.chunk_xxh3.push_back(XXH3_64bits(chunk.data(), chunk.size()));
    if (!options.cluster_key.empty())
      m.chunk_sha256.push_back(
          sha256_hex({reinterpret_cast<const char*>(chunk.data()), chunk.size()}));
    redis.command({"SET", chunk_key(m, m.chunk_xxh3.size() - 1),
                   std::string(reinterpret_cast<const char*>(chunk.data()), chunk.size()), "EX",
                   ttl});
  }
  m.sig = options.cluster_key.sign(manifest_signed_text(m));
  PublishReport report;
  report.bytes = file.size();
  report.chunks = m.chunk_xxh3.size();
  if (mode == Publish::kReplace) {
    const std::optional<Manifest> old = find_snapshot_or_damaged(redis, key, options.cluster_key);
    redis.command({"SET", keys::snapshot(key), manifest_to_json(m), "EX", ttl});
    report.published = true;
    if (old && old->upload != m.upload) {
      for (size_t i = 0; i < old->chunk_xxh3.size(); ++i)
        redis.command({"EXPIRE", chunk_key(*old, i), "60"});
    }
  } else {
    const redis::Reply set =
        redis.command({"SET", keys::snapshot(key), manifest_to_json(m), "NX", "EX", ttl});
    report.published = !set.is_nil();
  }
  if (!report.published) {
    // Another publisher's manifest won; its chunks are the ones readers use.
    for (size_t i = 0; i < m.chunk_xxh3.size(); ++i) redis.command({"DEL", chunk_key(m, i)});
    log_info("snapshot bus: {} was published by another writer first; this upload was dropped",
             key);
  }
  report.ms = w.ms();
  return report;
}

std::optional<Manifest> find_snapshot(redis::Client& redis, const std::string& key,
                                      const ClusterKey& cluster_key) {
  const redis::Reply r = redis.command({"GET", keys::snapshot(key)});
  if (r.is_nil()) return std::nullopt;
  Manifest m;
  try {
    m = manifest_from_json(r.str, key);
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", redis.url().address(), e.message()));
  }
  if (cluster_key.empty()) return m;
  const char* why = nullptr;
  if (m.sig.empty()) {
    why = "it is unsigned";
  } else if (!cluster_key.verifies(manifest_signed_text(m), m.sig)) {
    why = "it is signed with another cluster key";
  } else if (m.chunk_sha256.size() != m.chunk_xxh3.size()) {
    why = "it has no SHA-256 of its chunks";
  }
  if (why != nullptr) {
    throw Error(ErrorCode::kUnauthenticated,
                fmt::format("{}: the manifest of snapshot {} is refused: {}", redis.url().address(),
                            key, why));
  }
  return m;
}

void touch_snapshot(redis::Client& redis, const Manifest& m, int64_t ttl_s) {
  const std::string ttl = std::to_string(ttl_s);
  redis.command({"EXPIRE", keys::snapshot(m.key), ttl});
  for (size_t i = 0; i < m.chunk_xxh3.size(); ++i) redis.command({"EXPIRE", chunk_key(m, i), ttl});
}

namespace {

// One attempt of fetch_snapshot; `missing` is set when the manifest or a
// chunk was absent (worth another look), with the error to throw if it
// stays so.
std::vector<uint8_t> fetch_once(redis::Client& redis, const std::string& key,
                                const ClusterKey& cluster_key, int& refetched,
                                std::optional<Error>& missing) {
  const std::optional<Manifest> m = find_snapshot(redis, key, cluster_key);
  if (!m) {
    missing.emplace(ErrorCode::kNotFound, fmt::format("{}: the snapshot bus has no snapshot {}",
                                                      redis.url().address(), key));
    return {};
  }
  // The manifest's sizes are a Redis writer's word until the chunks bear
  // them out: no more is reserved up front than one chunk's worth.
  std::vector<uint8_t> file;
  file.reserve(std::min<uint64_t>(m->bytes, m->chunk_bytes));
  for (size_t i = 0; i < m->chunk_xxh3.size(); ++i) {
    const uint64_t want = std::min<uint64_t>(m->chunk_bytes, m->bytes - i * m->chunk_bytes);
    for (int attempt = 0;; ++attempt) {
      const redis::Reply r = redis.command({"GET", chunk_key(*m, i)});
      if (r.is_nil()) {
        missing.emplace(
            ErrorCode::kCorruption,
            fmt::format("{}: snapshot {}: chunk {} of {} is missing (expired or removed); the "
                        "coordinator publishes it again on its next run",
                        redis.url().address(), key, i, m->chunk_xxh3.size()));
        return {};
      }
      if (r.str.size() == want && XXH3_64bits(r.str.data(), r.str.size()) == m->chunk_xxh3[i]) {
        // XXH3 is no proof against a writer who means it: under a cluster
        // key the chunk must also have the SHA-256 the signed manifest says.
        if (!cluster_key.empty() && sha256_hex(r.str) != m->chunk_sha256[i]) {
          throw Error(ErrorCode::kUnauthenticated,
                      fmt::format("{}: snapshot {}: chunk {} of {} is refused: its SHA-256 is "
                                  "not the one its signed manifest gives",
                                  redis.url().address(), key, i, m->chunk_xxh3.size()));
        }
        file.insert(file.end(), r.str.begin(), r.str.end());
        break;
      }
      if (attempt == 1) {
        throw Error(
            ErrorCode::kCorruption,
            fmt::format("{}: snapshot {}: chunk {} of {} fails its checksum twice ({} "
                        "bytes, expected {})",
                        redis.url().address(), key, i, m->chunk_xxh3.size(), r.str.size(), want));
      }
      log_warn("snapshot bus: chunk {} of {} failed its checksum; reading it again", i, key);
      ++refetched;
    }
  }
  return file;
}

}  // namespace

std::vector<uint8_t> fetch_snapshot(redis::Client& redis, const std::string& key,
                                    const ClusterKey& cluster_key, FetchReport* report) {
  const Stopwatch w;
  int refetched = 0;
  for (double wait_s = 0.5;; wait_s *= 2) {
    std::optional<Error> missing;
    std::vector<uint8_t> file = fetch_once(redis, key, cluster_key, refetched, missing);
    if (!missing) {
      if (report != nullptr) {
        report->bytes = file.size();
        report->ms = w.ms();
        report->refetched_chunks = refetched;
      }
      return file;
    }
    if (wait_s > 2) throw *missing;
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
  }
}

}  // namespace swarmkv::cluster
