// The snapshot file format (docs/snapshot-format.md), its binding and key.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "swarmkv/measure.h"
#include "swarmkv/snapshot.h"

#ifndef SWARMKV_VERSION
#define SWARMKV_VERSION "unknown"
#endif

namespace swarmkv {
namespace {

constexpr char kMagic[8] = {'S', 'W', 'K', 'V', 'S', 'N', 'A', 'P'};
constexpr size_t kNameBytes = 16;
constexpr size_t kTableRow = kNameBytes + 4 + 3 * 8;  // name, codec, offset, size, xxh3
constexpr uint32_t kMaxMetaBytes = 1u << 20;
constexpr uint32_t kMaxSections = 1u << 16;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// The integer field `key` of a metadata object, as the file gives it: an
// integer (not 451.5, not "7") that T holds, or std::invalid_argument
// naming the field and its value (2^40 is not read as n_layer 0).
template <class T>
T integer_field(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  constexpr auto lo = std::numeric_limits<T>::min();
  constexpr auto hi = std::numeric_limits<T>::max();
  const bool fits = v.is_number_unsigned()  ? std::cmp_less_equal(v.get<uint64_t>(), hi)
                    : v.is_number_integer() ? std::in_range<T>(v.get<int64_t>())
                                            : false;
  if (!fits) {
    throw std::invalid_argument(
        fmt::format("'{}' is {}, not an integer in [{}, {}]", key, v.dump(), lo, hi));
  }
  return v.is_number_unsigned() ? static_cast<T>(v.get<uint64_t>())
                                : static_cast<T>(v.get<int64_t>());
}

}  // namespace

nlohmann::json kv_layout_json(const KvLayout& l) {
  nlohmann::json j = {{"architecture", l.architecture},
                      {"n_layer", l.n_layer},
                      {"n_embd_k", l.n_embd_k},
                      {"n_embd_v", l.n_embd_v},
                      {"type_k", l.type_k},
                      {"type_v", l.type_v},
                      {"flash_attn", l.flash_attn},
                      {"kv_unified", l.kv_unified},
                      {"n_swa", l.n_swa},
                      {"n_ubatch", l.n_ubatch},
                      {"batch_invariant", l.batch_invariant},
                      {"attention_invariant", l.attention_invariant}};
  // Written only when a GPU took part: a CPU state's layout, and so its
  // store key, stays what it was before the field existed.
  if (l.offloaded_layers != 0) j["offloaded_layers"] = l.offloaded_layers;
  return j;
}

KvLayout kv_layout_from_json(const nlohmann::json& j) {
  KvLayout l;
  l.architecture = j.at("architecture").get<std::string>();
  l.n_layer = integer_field<int32_t>(j, "n_layer");
  l.n_embd_k = integer_field<int32_t>(j, "n_embd_k");
  l.n_embd_v = integer_field<int32_t>(j, "n_embd_v");
  l.type_k = j.at("type_k").get<std::string>();
  l.type_v = j.at("type_v").get<std::string>();
  l.flash_attn = j.at("flash_attn").get<bool>();
  l.kv_unified = j.at("kv_unified").get<bool>();
  l.n_swa = integer_field<int32_t>(j, "n_swa");
  l.n_ubatch = integer_field<uint32_t>(j, "n_ubatch");
  l.batch_invariant = j.value("batch_invariant", false);  // files from before the key: not
  l.attention_invariant = j.value("attention_invariant", false);
  if (j.contains("offloaded_layers"))
    l.offloaded_layers = integer_field<int32_t>(j, "offloaded_layers");
  return l;
}

namespace {

std::string meta_json(const SnapshotMeta& m) {
  const nlohmann::json j = {
      {"engine", m.binding.engine},
      {"state_version", m.binding.state_version},
      {"model_sha256", m.binding.model_sha256},
      {"layout", kv_layout_json(m.binding.layout)},
      {"n_tokens", m.tokens.size()},
      {"payload_bytes", m.payload_bytes},
      {"created_unix", m.created_unix},
      {"producer", m.producer},
      {"model_file", m.model_file},
  };
  return j.dump();
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  throw Error(ErrorCode::kCorruption, fmt::format("snapshot '{}': {}", path, what));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// Where the decoder reads a snapshot's bytes from: a file, or memory (a
// file received from the bus). `name` names it in errors.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual const std::string& name() const = 0;
  virtual uint64_t size() const = 0;
  // Exactly `n` bytes at `offset` into dst; false when the bytes end first.
  // Throws Error(kIo) when reading fails.
  virtual bool read(uint64_t offset, uint8_t* dst, uint64_t n) const = 0;
};

class FileSource final : public ByteSource {
 public:
  explicit FileSource(const std::string& path) : path_(path), fd_(open(path)) {
    struct stat st {};
    if (::fstat(fd_.get(), &st) != 0) {
      throw Error(ErrorCode::kIo,
                  fmt::format("cannot stat snapshot '{}': {}", path, std::strerror(errno)));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  const std::string& name() const override { return path_; }
  uint64_t size() const override { return size_; }
  bool read(uint64_t offset, uint8_t* dst, uint64_t n) const override {
    uint64_t done = 0;
    while (done < n) {
      const ssize_t got =
          ::pread(fd_.get(), dst + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0) {
        if (errno == EINTR) continue;
        throw Error(ErrorCode::kIo,
                    fmt::format("reading snapshot '{}' failed: {}", path_, std::strerror(errno)));
      }
      if (got == 0) return false;
      done += static_cast<uint64_t>(got);
    }
    return true;
  }

 private:
  static int open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) {
        throw Error(ErrorCode::kNotFound, fmt::format("snapshot '{}' does not exist", path));
      }
      throw Error(ErrorCode::kIo,
                  fmt::format("cannot open snapshot '{}': {}", path, std::strerror(errno)));
    }
    return fd;
  }
  std::string path_;
  Fd fd_;
  uint64_t size_ = 0;
};

class MemorySource final : public ByteSource {
 public:
  MemorySource(std::span<const uint8_t> bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)) {}
  const std::string& name() const override { return name_; }
  uint64_t size() const override { return bytes_.size(); }
  bool read(uint64_t offset, uint8_t* dst, uint64_t n) const override {
    // As pread does: what there is, then false when it was not all.
    const uint64_t have = offset < bytes_.size() ? std::min(n, bytes_.size() - offset) : 0;
    if (have > 0) std::memcpy(dst, bytes_.data() + offset, have);
    return have == n;
  }
  std::span<const uint8_t> bytes() const { return bytes_; }

 private:
  std::span<const uint8_t> bytes_;
  std::string name_;
};

// Written so that no sum wraps: the sizes come from the file.
void check_in_bounds(const ByteSource& src, const SnapshotSection& s) {
  if (s.size > src.size() || s.offset > src.size() - s.size) {
    corrupt(src.name(), fmt::format("truncated: section '{}' needs bytes [{}, {}), the file has {}",
                                    s.name, s.offset, s.offset + s.size, src.size()));
  }
}

void check_sum(const ByteSource& src, const SnapshotSection& s, const uint8_t* data,
               SnapshotReadTimes* times) {
  const Stopwatch v;
  const uint64_t sum = XXH3_64bits(data, s.size);
  if (times != nullptr) times->verify_ms += v.ms();
  if (sum != s.xxh3) {
    corrupt(src.name(),
            fmt::format("checksum mismatch in section '{}' (stored {:016x}, computed {:016x})",
                        s.name, s.xxh3, sum));
  }
}

// Reads a section's bytes and checks them against the table.
void read_section(const ByteSource& src, const SnapshotSection& s, uint8_t* dst,
                  SnapshotReadTimes* times) {
  check_in_bounds(src, s);
  const Stopwatch r;
  if (!src.read(s.offset, dst, s.size)) {
    corrupt(src.name(), fmt::format("truncated while reading section '{}'", s.name));
  }
  if (times != nullptr) times->read_ms += r.ms();
  check_sum(src, s, dst, times);
}

void fsync_dir(const std::filesystem::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself is atomic
  ::fsync(fd);
  ::close(fd);
}

// Writes `parts` one after another to `path` atomically: a temporary file in
// the same folder, fsync, rename over `path`, fsync the folder.
void write_atomically(const std::string& path, std::span<const std::span<const uint8_t>> parts) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir =
      target.has_parent_path() ? target.parent_path() : std::filesystem::path(".");
  std::random_device rd;
  const std::string tmp =
      (dir / fmt::format(".tmp-{}-{}-{:08x}", target.filename().string(), ::getpid(), rd()))
          .string();
  // Owner only: a document's KV state is as private as its text.
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) {
    throw Error(ErrorCode::kIo, fmt::format("cannot create '{}' to write snapshot '{}': {}", tmp,
                                            path, std::strerror(errno)));
  }
  const auto fail = [&](const std::string& what) {
    const int saved = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo, fmt::format("writing snapshot '{}' failed ({}): {}", path, what,
                                            std::strerror(saved)));
  };
  const auto write_all = [&](const uint8_t* p, uint64_t n) {
    while (n > 0) {
      const ssize_t put = ::write(fd, p, n);
      if (put < 0) {
        if (errno == EINTR) continue;
        fail("write");
      }
      p += put;
      n -= static_cast<uint64_t>(put);
    }
  };
  for (const std::span<const uint8_t> part : parts) write_all(part.data(), part.size());
  if (::fsync(fd) != 0) fail("fsync");
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo, fmt::format("writing snapshot '{}' failed (close): {}", path,
                                            std::strerror(errno)));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int saved = errno;
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo,
                fmt::format("cannot publish snapshot '{}': {}", path, std::strerror(saved)));
  }
  fsync_dir(dir);
}

}  // namespace

SnapshotBinding binding_of(const Model& model, const ContextOptions& options) {
  SnapshotBinding b;
  b.engine = engine_id();
  b.state_version = engine_state_version();
  b.model_sha256 = model_fingerprint(model.path());
  b.layout = kv_layout(model, options);
  return b;
}

std::string snapshot_key(const SnapshotBinding& binding, std::span<const Token> tokens) {
  XXH3_state_t* state = XXH3_createState();
  if (state == nullptr) throw std::bad_alloc();
  XXH3_128bits_reset(state);
  const std::string head = fmt::format(
      "swarmkv-snapshot-v{}\n{}\n{}\n{}\n{}\n", kSnapshotFormatVersion, binding.engine,
      binding.state_version, binding.model_sha256, kv_layout_json(binding.layout).dump());
  XXH3_128bits_update(state, head.data(), head.size());
  for (const Token t : tokens) {
    const uint32_t v = static_cast<uint32_t>(t);
    const uint8_t le[4] = {static_cast<uint8_t>(v), static_cast<uint8_t>(v >> 8),
                           static_cast<uint8_t>(v >> 16), static_cast<uint8_t>(v >> 24)};
    XXH3_128bits_update(state, le, sizeof(le));
  }
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

namespace {

// A snapshot file is head + tokens + the payload as is: the head holds the
// magic, the metadata and the section table (the payload cut into
// kSnapshotSectionBytes sections, each with its checksum).
struct EncodedParts {
  std::string head;
  std::string tokens;
};

EncodedParts encode_parts(const SnapshotMeta& meta_in, std::span<const uint8_t> payload) {
  SnapshotMeta meta = meta_in;
  meta.payload_bytes = payload.size();
  if (meta.producer.empty()) meta.producer = std::string("swarmkv ") + SWARMKV_VERSION;
  if (meta.created_unix == 0) {
    meta.created_unix = std::chrono::duration_cast<std::chrono::seconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
  }
  EncodedParts out;
  out.tokens.reserve(meta.tokens.size() * 4);
  for (const Token t : meta.tokens) put_u32(out.tokens, static_cast<uint32_t>(t));
  struct Piece {
    std::string name;
    const uint8_t* data;
    uint64_t size;
  };
  std::vector<Piece> pieces{
      {"tokens", reinterpret_cast<const uint8_t*>(out.tokens.data()), out.tokens.size()}};
  for (uint64_t at = 0, i = 0; at < payload.size(); at += kSnapshotSectionBytes, ++i) {
    pieces.push_back({fmt::format("kv.{}", i), payload.data() + at,
                      std::min<uint64_t>(kSnapshotSectionBytes, payload.size() - at)});
  }

  const std::string json = meta_json(meta);
  std::string& header = out.head;
  header.assign(kMagic, sizeof(kMagic));
  put_u32(header, meta.format_version);
  put_u32(header, static_cast<uint32_t>(json.size()));
  header += json;
  put_u32(header, static_cast<uint32_t>(pieces.size()));
  uint64_t offset = header.size() + pieces.size() * kTableRow + 8;
  for (const Piece& p : pieces) {
    std::string name = p.name;
    name.resize(kNameBytes, '\0');
    header += name;
    put_u32(header, 0);  // codec: 0 = stored as is (NOTES.md: compression did not pay)
    put_u64(header, offset);
    put_u64(header, p.size);
    put_u64(header, XXH3_64bits(p.data, p.size));
    offset += p.size;
  }
  put_u64(header, XXH3_64bits(header.data(), header.size()));
  return out;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

std::vector<uint8_t> encode_snapshot(const SnapshotMeta& meta, std::span<const uint8_t> payload) {
  const EncodedParts parts = encode_parts(meta, payload);
  std::vector<uint8_t> file;
  file.reserve(parts.head.size() + parts.tokens.size() + payload.size());
  for (const std::span<const uint8_t> part :
       {bytes_of(parts.head), bytes_of(parts.tokens), payload})
    file.insert(file.end(), part.begin(), part.end());
  return file;
}

void write_snapshot(const std::string& path, const SnapshotMeta& meta,
                    std::span<const uint8_t> payload) {
  const EncodedParts parts = encode_parts(meta, payload);
  const std::span<const uint8_t> file[] = {bytes_of(parts.head), bytes_of(parts.tokens), payload};
  write_atomically(path, file);
}

void write_snapshot_bytes(const std::string& path, std::span<const uint8_t> file) {
  const std::span<const uint8_t> parts[] = {file};
  write_atomically(path, parts);
}

namespace {

// The head as the file holds it: the fixed part (magic, version, metadata
// length), the metadata, the section count, the section table and the head's
// checksum, verified against that checksum.
struct Head {
  std::vector<uint8_t> bytes;
  uint32_t version = 0;
  uint32_t meta_len = 0;  // the metadata's bytes, at kFixedBytes
  uint32_t n_sections = 0;
  size_t table_at = 0;  // where the section table starts
  static constexpr size_t kFixedBytes = 16;
};

Head read_head(const ByteSource& src, uint64_t file_bytes) {
  const std::string& path = src.name();
  Head h;
  uint8_t fixed[Head::kFixedBytes];
  if (!src.read(0, fixed, sizeof(fixed)) || std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0) {
    if (std::memcmp(fixed, kMagic, std::min<uint64_t>(file_bytes, sizeof(kMagic))) == 0) {
      corrupt(path, fmt::format("truncated in the header ({} bytes)", file_bytes));
    }
    corrupt(path, "not a SwarmKV snapshot (no SWKVSNAP magic)");
  }
  h.version = get_u32(fixed + 8);
  h.meta_len = get_u32(fixed + 12);
  if (h.meta_len > kMaxMetaBytes) {
    corrupt(path,
            fmt::format("metadata length {} is beyond the limit {}", h.meta_len, kMaxMetaBytes));
  }
  std::vector<uint8_t>& head = h.bytes;
  head.resize(sizeof(fixed) + h.meta_len + 4);
  std::memcpy(head.data(), fixed, sizeof(fixed));
  if (!src.read(sizeof(fixed), head.data() + sizeof(fixed), h.meta_len + 4)) {
    corrupt(path, fmt::format("truncated in the header ({} bytes)", file_bytes));
  }
  h.n_sections = get_u32(head.data() + sizeof(fixed) + h.meta_len);
  if (h.n_sections > kMaxSections) {
    corrupt(path,
            fmt::format("section count {} is beyond the limit {}", h.n_sections, kMaxSections));
  }
  h.table_at = head.size();
  head.resize(h.table_at + h.n_sections * kTableRow + 8);
  if (!src.read(h.table_at, head.data() + h.table_at, head.size() - h.table_at)) {
    corrupt(path, fmt::format("truncated in the header ({} bytes)", file_bytes));
  }
  const uint64_t stored = get_u64(head.data() + head.size() - 8);
  const uint64_t computed = XXH3_64bits(head.data(), head.size() - 8);
  if (stored != computed) {
    corrupt(path, fmt::format("header checksum mismatch (stored {:016x}, computed {:016x})", stored,
                              computed));
  }
  // The checksum holds: a version we do not know is a newer writer, not damage.
  if (h.version != kSnapshotFormatVersion) {
    throw Error(ErrorCode::kIncompatible,
                fmt::format("snapshot '{}' has format version {}, this build reads version {}",
                            path, h.version, kSnapshotFormatVersion));
  }
  return h;
}

// The head's metadata into `meta` (all but its tokens); returns its n_tokens.
uint64_t decode_meta(const std::string& path, const Head& head, SnapshotMeta& meta) {
  uint64_t n_tokens = 0;
  try {
    const auto text = head.bytes.begin() + Head::kFixedBytes;
    const auto j = nlohmann::json::parse(text, text + head.meta_len);
    meta.format_version = head.version;
    meta.binding.engine = j.at("engine").get<std::string>();
    meta.binding.state_version = integer_field<uint32_t>(j, "state_version");
    meta.binding.model_sha256 = j.at("model_sha256").get<std::string>();
    meta.binding.layout = kv_layout_from_json(j.at("layout"));
    n_tokens = integer_field<uint64_t>(j, "n_tokens");
    meta.payload_bytes = integer_field<uint64_t>(j, "payload_bytes");
    meta.created_unix = integer_field<int64_t>(j, "created_unix");
    meta.producer = j.at("producer").get<std::string>();
    meta.model_file = j.at("model_file").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    corrupt(path, fmt::format("unreadable metadata: {}", e.what()));
  } catch (const std::invalid_argument& e) {
    corrupt(path, fmt::format("unreadable metadata: {}", e.what()));
  }
  return n_tokens;
}

// The head's section table, each row checked where it must be ("tokens",
// then "kv.0", "kv.1", ... back to back after the head); returns the sum of
// the KV sections' sizes.
uint64_t decode_sections(const std::string& path, const Head& head,
                         std::vector<SnapshotSection>& sections) {
  uint64_t expected_offset = head.bytes.size();
  uint64_t payload = 0;
  for (uint32_t i = 0; i < head.n_sections; ++i) {
    const uint8_t* row = head.bytes.data() + head.table_at + i * kTableRow;
    SnapshotSection s;
    s.name.assign(reinterpret_cast<const char*>(row), kNameBytes);
    s.name.resize(std::strlen(s.name.c_str()));
    const uint32_t codec = get_u32(row + kNameBytes);
    s.offset = get_u64(row + kNameBytes + 4);
    s.size = get_u64(row + kNameBytes + 12);
    s.xxh3 = get_u64(row + kNameBytes + 20);
    const std::string expected_name = i == 0 ? "tokens" : fmt::format("kv.{}", i - 1);
    // The sizes are the file's word: a sum of them must not wrap.
    if (s.name != expected_name || codec != 0 || s.offset != expected_offset ||
        s.size > std::numeric_limits<uint64_t>::max() - expected_offset) {
      corrupt(path,
              fmt::format("section table row {} is malformed ('{}', codec {}, offset {}, size {})",
                          i, s.name, codec, s.offset, s.size));
    }
    expected_offset += s.size;
    if (i > 0) payload += s.size;
    sections.push_back(std::move(s));
  }
  return payload;
}

// The file ends where its last section does: else where it is cut short
// (the first section it ends in), or how much follows.
void check_file_end(const std::string& path, const SnapshotHeader& h) {
  const SnapshotSection& last = h.sections.back();
  if (last.offset + last.size == h.file_bytes) return;
  if (last.offset + last.size > h.file_bytes) {
    for (const SnapshotSection& s : h.sections) {
      if (s.offset + s.size > h.file_bytes) {
        corrupt(path, fmt::format("truncated: section '{}' needs bytes [{}, {}), the file has {}",
                                  s.name, s.offset, s.offset + s.size, h.file_bytes));
      }
    }
  }
  corrupt(path,
          fmt::format("{} bytes after the last section", h.file_bytes - last.offset - last.size));
}

// The header and the tokens section, verified (read_snapshot_header's contract).
SnapshotHeader decode_header(const ByteSource& src) {
  const std::string& path = src.name();
  SnapshotHeader h;
  h.file_bytes = src.size();
  if (h.file_bytes == 0) corrupt(path, "the file is empty (0 bytes)");
  const Head head = read_head(src, h.file_bytes);
  const uint64_t n_tokens = decode_meta(path, head, h.meta);
  const uint64_t payload = decode_sections(path, head, h.sections);
  if (h.sections.empty() || h.sections[0].size % 4 != 0 || h.sections[0].size / 4 != n_tokens ||
      payload != h.meta.payload_bytes) {
    corrupt(path,
            fmt::format("the section table does not match the metadata ({} tokens, {} payload "
                        "bytes)",
                        n_tokens, h.meta.payload_bytes));
  }

  check_in_bounds(src, h.sections[0]);  // before its size is allocated
  std::vector<uint8_t> tokens(h.sections[0].size);
  read_section(src, h.sections[0], tokens.data(), nullptr);
  h.meta.tokens.resize(n_tokens);
  for (uint64_t i = 0; i < n_tokens; ++i) {
    h.meta.tokens[i] = static_cast<Token>(get_u32(tokens.data() + 4 * i));
  }
  check_file_end(path, h);
  return h;
}

// Every KV section into one buffer, verified.
std::vector<uint8_t> decode_payload(const ByteSource& src, const SnapshotHeader& header,
                                    SnapshotReadTimes* times) {
  std::vector<uint8_t> out(header.meta.payload_bytes);
  uint64_t at = 0;
  for (size_t i = 1; i < header.sections.size(); ++i) {
    read_section(src, header.sections[i], out.data() + at, times);
    at += header.sections[i].size;
  }
  return out;
}

}  // namespace

SnapshotHeader read_snapshot_header(const std::string& path) {
  return decode_header(FileSource(path));
}

bool has_snapshot_magic(const std::string& path) noexcept {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kMagic)] = {};
  return in.read(magic, sizeof(magic)) && std::memcmp(magic, kMagic, sizeof(kMagic)) == 0;
}

std::vector<uint8_t> read_snapshot_payload(const std::string& path, const SnapshotHeader& header,
                                           SnapshotReadTimes* times) {
  return decode_payload(FileSource(path), header, times);
}

SnapshotHeader decode_snapshot_header(std::span<const uint8_t> file, const std::string& name) {
  return decode_header(MemorySource(file, name));
}

std::vector<uint8_t> decode_snapshot_payload(std::span<const uint8_t> file,
                                             const SnapshotHeader& header,
                                             const std::string& name) {
  return decode_payload(MemorySource(file, name), header, nullptr);
}

SnapshotHeader verify_snapshot(std::span<const uint8_t> file, const std::string& name) {
  const MemorySource src(file, name);
  SnapshotHeader header = decode_header(src);
  for (size_t i = 1; i < header.sections.size(); ++i) {
    const SnapshotSection& s = header.sections[i];
    check_in_bounds(src, s);
    check_sum(src, s, file.data() + s.offset, nullptr);
  }
  return header;
}

void check_binding(const std::string& path, const SnapshotBinding& snapshot,
                   const SnapshotBinding& context) {
  const auto refuse = [&](std::string_view field, const auto& made_for, const auto& here) {
    throw Error(ErrorCode::kIncompatible,
                fmt::format("snapshot '{}' was made for {} {}, this run has {}", path, field,
                            made_for, here));
  };
  if (snapshot.model_sha256 != context.model_sha256) {
    refuse("the model with sha256", snapshot.model_sha256, context.model_sha256);
  }
  if (snapshot.engine != context.engine) refuse("engine", snapshot.engine, context.engine);
  if (snapshot.state_version != context.state_version) {
    refuse("state format version", snapshot.state_version, context.state_version);
  }
  const KvLayout& a = snapshot.layout;
  const KvLayout& b = context.layout;
  if (a.architecture != b.architecture) refuse("architecture", a.architecture, b.architecture);
  if (a.n_layer != b.n_layer) refuse("n_layer", a.n_layer, b.n_layer);
  if (a.n_embd_k != b.n_embd_k) refuse("n_embd_k", a.n_embd_k, b.n_embd_k);
  if (a.n_embd_v != b.n_embd_v) refuse("n_embd_v", a.n_embd_v, b.n_embd_v);
  if (a.type_k != b.type_k) refuse("type_k", a.type_k, b.type_k);
  if (a.type_v != b.type_v) refuse("type_v", a.type_v, b.type_v);
  if (a.flash_attn != b.flash_attn) refuse("flash_attn", a.flash_attn, b.flash_attn);
  if (a.kv_unified != b.kv_unified) refuse("kv_unified", a.kv_unified, b.kv_unified);
  if (a.n_swa != b.n_swa) refuse("n_swa", a.n_swa, b.n_swa);
  if (a.n_ubatch != b.n_ubatch) refuse("n_ubatch", a.n_ubatch, b.n_ubatch);
  if (a.batch_invariant != b.batch_invariant)
    refuse("batch_invariant", a.batch_invariant, b.batch_invariant);
  if (a.attention_invariant != b.attention_invariant)
    refuse("attention_invariant", a.attention_invariant, b.attention_invariant);
  if (a.offloaded_layers != b.offloaded_layers)
    refuse("offloaded_layers (K/V computed on a GPU)", a.offloaded_layers, b.offloaded_layers);
}

std::string_view to_string(SnapshotCacheMode mode) noexcept {
  switch (mode) {
    case SnapshotCacheMode::kOff:
      return "off";
    case SnapshotCacheMode::kOn:
      return "on";
    case SnapshotCacheMode::kReadOnly:
      return "read-only";
  }
  return "unknown";
}

SnapshotCacheMode parse_snapshot_cache_mode(std::string_view name) {
  if (name == "on") return SnapshotCacheMode::kOn;
  if (name == "off") return SnapshotCacheMode::kOff;
  if (name == "read-only") return SnapshotCacheMode::kReadOnly;
  throw Error(
      ErrorCode::kInvalidArgument,
      fmt::format("unknown snapshot cache mode '{}' (expected on, off or read-only)", name));
}

}  // namespace swarmkv
