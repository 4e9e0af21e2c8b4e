// Snapshots: a document prefix's KV state as a file that outlives the run,
// bound to the exact weights, engine and KV layout that produced it.
//
// A snapshot holds the whole-context state (Context::state_get) of a context
// that holds only the prefix, on sequence 0: it puts every cell back at its
// index, which keeps restored answers bit-identical to a prefill on
// sliding-window models too (NOTES.md). The file format is documented in
// docs/snapshot-format.md; every section carries an XXH3-64 checksum and the
// header carries one over itself, so a truncated or damaged file is refused
// (kCorruption) before any KV cell is touched.
//
// Thread rules: the free functions are thread-safe (they share no state);
// a SnapshotStore is thread-compatible, and several processes may use one
// store directory at once (publication is an atomic rename).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"

namespace swarmkv {

inline constexpr uint32_t kSnapshotFormatVersion = 1;
// KV payload section size: a damaged byte names a 16 MiB section, and the
// network bus (later) can move sections as its chunks.
inline constexpr uint64_t kSnapshotSectionBytes = 16ull << 20;

// What a snapshot's bytes are bound to. A snapshot is restored only into a
// context whose binding is equal, field by field.
struct SnapshotBinding {
  std::string engine;          // engine_id(): llama.cpp commit + our patches
  uint32_t state_version = 0;  // engine_state_version()
  std::string model_sha256;    // model_fingerprint() of the GGUF
  KvLayout layout;
  bool operator==(const SnapshotBinding&) const = default;
};

struct SnapshotMeta {
  uint32_t format_version = kSnapshotFormatVersion;
  SnapshotBinding binding;
  std::vector<Token> tokens;  // the prefix, in order; its KV state is the payload
  uint64_t payload_bytes = 0;
  int64_t created_unix = 0;  // seconds since the epoch
  std::string producer;      // "swarmkv <version>"
  std::string model_file;    // the GGUF's file name, for people (the binding uses the hash)
};

struct SnapshotSection {
  std::string name;  // "tokens", "kv.0", "kv.1", ...
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t xxh3 = 0;  // XXH3-64 of the section's bytes
};

struct SnapshotHeader {
  SnapshotMeta meta;
  std::vector<SnapshotSection> sections;
  uint64_t file_bytes = 0;  // the file's size when it was read
};

// What reading a snapshot cost, in milliseconds.
struct SnapshotReadTimes {
  double read_ms = 0;    // bytes from the file into memory
  double verify_ms = 0;  // checksums
};

// The layout as the snapshot format writes it (the metadata's "layout",
// whose dumped bytes a snapshot key hashes; `snapshot info` and `run
// --json` print the same object): {"architecture", "n_layer", "n_embd_k",
// "n_embd_v", "type_k", "type_v", "flash_attn", "kv_unified", "n_swa",
// "n_ubatch", "batch_invariant", "attention_invariant"}, and
// "offloaded_layers" where it is not 0.
nlohmann::json kv_layout_json(const KvLayout& l);
// The layout kv_layout_json wrote (a missing "batch_invariant" or
// "attention_invariant" reads as false: the file cannot say; a missing
// "offloaded_layers" as 0); throws nlohmann::json::exception for
// a missing key or a wrong type, std::invalid_argument (naming the field and its value) for a
// number that is not an integer its field's type holds.
KvLayout kv_layout_from_json(const nlohmann::json& j);

// The binding of a prefix state made by a context with `options` on
// `model`: engine, state version, the model's fingerprint and kv_layout().
SnapshotBinding binding_of(const Model& model, const ContextOptions& options);

// The store key of a prefix: 32 hex digits of XXH3-128 over the binding and
// the tokens. Equal keys mean equal bindings and equal tokens.
std::string snapshot_key(const SnapshotBinding& binding, std::span<const Token> tokens);

// The bytes of the snapshot file of `meta` and `payload`, in memory (what
// write_snapshot writes; the bus sends them as they are).
std::vector<uint8_t> encode_snapshot(const SnapshotMeta& meta, std::span<const uint8_t> payload);

// Writes `meta` and `payload` to `path` atomically: a temporary file in the
// same folder, fsync, rename over `path`, fsync the folder. Readers see the
// old file or the new one, never a part. Throws Error(kIo) naming the path;
// no temporary file is left behind.
void write_snapshot(const std::string& path, const SnapshotMeta& meta,
                    std::span<const uint8_t> payload);

// Writes a whole snapshot file's bytes (received from elsewhere: the Redis
// bus) to `path` atomically, as write_snapshot does. Checks nothing; read
// the file back to verify it. Throws Error(kIo) naming the path.
void write_snapshot_bytes(const std::string& path, std::span<const uint8_t> file);

// Reads and verifies the header and the tokens section. Throws
// Error(kNotFound) for a missing file, Error(kIo) when it cannot be read,
// Error(kCorruption) naming the file and what is wrong (empty, not a
// snapshot, truncated in the header or at a section, a checksum, the
// metadata), Error(kIncompatible) for another format version.
SnapshotHeader read_snapshot_header(const std::string& path);
// Whether the file at `path` begins with the snapshot magic ("SWKVSNAP"),
// however damaged the rest: what `snapshot rm` asks of a path before it
// removes it. False for a file that cannot be opened or is shorter.
bool has_snapshot_magic(const std::string& path) noexcept;

// Reads every KV section into one buffer, verifying each checksum. Throws
// Error(kCorruption) naming the file and the section (truncated or checksum
// mismatch), Error(kIo) when reading fails.
std::vector<uint8_t> read_snapshot_payload(const std::string& path, const SnapshotHeader& header,
                                           SnapshotReadTimes* times = nullptr);

// The same reads on a whole snapshot file in memory (received from the
// bus), with the same errors; `name` stands for the path in them.
SnapshotHeader decode_snapshot_header(std::span<const uint8_t> file, const std::string& name);
std::vector<uint8_t> decode_snapshot_payload(std::span<const uint8_t> file,
                                             const SnapshotHeader& header, const std::string& name);
// decode_snapshot_header and every KV section's checksum, without copying
// the payload: what a file must pass before it is stored.
SnapshotHeader verify_snapshot(std::span<const uint8_t> file, const std::string& name);

// Throws Error(kIncompatible) naming the first field that differs, with the
// value the snapshot was made for and the value this context has.
void check_binding(const std::string& path, const SnapshotBinding& snapshot,
                   const SnapshotBinding& context);

// The SHA-256 of a GGUF, in hex. Cached under <cache_dir()>/fingerprints per
// absolute path, size and modification time, so a model is hashed once.
// Throws Error(kNotFound) / Error(kIo).
std::string model_fingerprint(const std::string& gguf_path);

// How a run uses the automatic snapshot store.
enum class SnapshotCacheMode {
  kOff,       // never look, never publish
  kOn,        // look the prefix up; on a miss prefill and publish
  kReadOnly,  // look up, never write or remove
};
std::string_view to_string(SnapshotCacheMode mode) noexcept;
// Parses "on", "off" or "read-only"; throws Error(kInvalidArgument).
SnapshotCacheMode parse_snapshot_cache_mode(std::string_view name);

// The default cap of the store: $SWARMKV_SNAPSHOT_CACHE_MAX (bytes, with an
// optional K, M, G or T suffix, powers of 1024), else 4 GiB. Throws
// Error(kInvalidArgument) for a malformed value.
uint64_t default_snapshot_cache_max();
// Parses "4G", "512M", "1048576"; throws Error(kInvalidArgument).
uint64_t parse_byte_size(std::string_view text);

// The snapshot store's folder: `dir` when it is not empty, else
// <cache_dir()>/snapshots.
std::string snapshot_store_dir(const std::string& dir = {});

// A content-addressed folder of snapshots: <dir>/<key>.swkv. Last use is the
// file's modification time (lookups touch it); publishing evicts the least
// recently used entries above the cap.
class SnapshotStore {
 public:
  // `dir` is created on first publish. `max_bytes` 0: default_snapshot_cache_max().
  explicit SnapshotStore(std::string dir, uint64_t max_bytes = 0);
  // <cache_dir()>/snapshots with the default cap.
  static SnapshotStore open_default();

  const std::string& dir() const noexcept { return dir_; }
  uint64_t max_bytes() const noexcept { return max_bytes_; }
  std::string path_of(const std::string& key) const;

  struct Entry {
    std::string key;
    std::string path;
    uint64_t bytes = 0;
    int64_t last_used_unix = 0;
    std::optional<SnapshotHeader> header;  // unset when the header is unreadable
    std::optional<ErrorValue> error;       // why, when unset
  };
  // Every *.swkv file, most recently used first, with its header read.
  std::vector<Entry> list() const;

  struct Match {
    Entry entry;
    size_t common_tokens = 0;  // leading tokens the entry shares with the request
  };
  // The entry of this binding sharing the longest token prefix with `tokens`
  // (an exact key first), if it shares at least `min_common` tokens.
  // Entries with an unreadable header are skipped and appended to `bad`.
  std::optional<Match> best_match(const SnapshotBinding& binding, std::span<const Token> tokens,
                                  size_t min_common, std::vector<Entry>* bad = nullptr) const;

  // Publishes under snapshot_key(meta) atomically, then evicts least
  // recently used entries (never the new one) until the store fits the cap.
  // Returns the entry's path. Throws Error(kIo).
  std::string publish(const SnapshotMeta& meta, std::span<const uint8_t> payload);
  // Verifies a whole snapshot file received from elsewhere in memory
  // (verify_snapshot, and that its binding and tokens hash to `key`), then
  // stores it under `key` atomically and evicts as publish does; bytes that
  // fail never reach the folder. Returns the entry's path. Throws
  // Error(kCorruption) naming the key for bytes that are not a valid
  // snapshot of that key, Error(kIo) when writing fails.
  std::string adopt(const std::string& key, std::span<const uint8_t> file);
  // Marks an entry as just used.
  void touch(const std::string& path) const;
  // Removes an entry's file; false when it did not exist.
  bool remove_path(const std::string& path) const;

  struct GcReport {
    int entries_removed = 0;
    int temporaries_removed = 0;  // left by writers that died mid-write
    uint64_t bytes_freed = 0;
    uint64_t bytes_kept = 0;
  };
  // Evicts least recently used entries until the store fits `max_bytes`, and
  // removes temporary files older than an hour.
  GcReport gc(uint64_t max_bytes) const;

 private:
  // The entries, most recently used first; headers only when asked (eviction
  // needs sizes and last-use times, not the headers' token checksums).
  std::vector<Entry> scan(bool read_headers) const;
  // Removes least recently used entries except `keep` until the total fits
  // `max_bytes`; returns {entries removed, bytes freed, bytes kept}.
  GcReport evict(uint64_t max_bytes, const std::string& keep) const;

  std::string dir_;
  uint64_t max_bytes_;
};

// Where kShared and kHost get the document's KV state (kNone never uses a
// snapshot: it is the re-prefill reference). In order: `file` when set, else
// the store when `cache` is not kOff, else a prefill.
struct SnapshotOptions {
  // The library's default is kOff (an embedding program opts in); the CLI's
  // is kOn.
  SnapshotCacheMode cache = SnapshotCacheMode::kOff;
  std::string cache_dir;         // empty: <cache_dir()>/snapshots
  uint64_t cache_max_bytes = 0;  // 0: default_snapshot_cache_max()
  // Restore this snapshot file. Unlike a bad store entry (a warning, then a
  // prefill), any problem with it fails the document node.
  std::string file;
};

enum class SnapshotSource { kPrefill, kCache, kFile, kRedis };
std::string_view to_string(SnapshotSource source) noexcept;

// How a run obtained the document's KV state.
struct SnapshotUse {
  SnapshotSource source = SnapshotSource::kPrefill;  // where the reused tokens came from
  std::string key;                                   // snapshot_key() of the document's prefix
  std::string path;              // the file read, or the store entry published ("" if none)
  int32_t reused_tokens = 0;     // prefix tokens restored from the snapshot
  int32_t prefilled_tokens = 0;  // prefix tokens decoded in this run
  size_t bytes = 0;              // the prefix's KV state
  double load_ms = 0;            // finding, reading and verifying the snapshot (and trimming it)
  double verify_ms = 0;          // the checksums, part of load_ms
  bool published = false;        // written to the store by this run
  // Store entries this run found damaged and skipped (warnings; the run
  // went on without them).
  std::vector<ErrorValue> discarded;
};

}  // namespace swarmkv
