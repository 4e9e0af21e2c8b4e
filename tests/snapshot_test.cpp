// The snapshot format, its validation and the disk store, without a model:
// the payload is synthetic bytes (the engine's restore is covered by
// snapshot_model_test.cpp).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "prefix/prefix_source.h"
#include "swarmkv/error.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace {

namespace fs = std::filesystem;

SnapshotBinding test_binding() {
  SnapshotBinding b;
  b.engine = "0c1e57098+pe3f6dd2ca631";
  b.state_version = 10;
  b.model_sha256 = std::string(64, 'a');
  b.layout = {"llama", 30, 192, 192, "f16", "f16", false, false, 0, 512};
  return b;
}

SnapshotMeta test_meta(size_t n_tokens, Token first = 1) {
  SnapshotMeta m;
  m.binding = test_binding();
  for (size_t i = 0; i < n_tokens; ++i) m.tokens.push_back(first + static_cast<Token>(i));
  m.model_file = "test.gguf";
  return m;
}

std::vector<uint8_t> payload_of(size_t n, uint32_t seed = 7) {
  std::vector<uint8_t> p(n);
  std::mt19937 rng(seed);
  for (auto& b : p) b = static_cast<uint8_t>(rng());
  return p;
}

class SnapshotFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("swarmkv-snapshot-test-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // The error of reading `file` whole (header, then payload); "" when none.
  // The same bytes decoded in memory, and verified in memory, must fail
  // with the same error (the codec is one, the file only its source).
  static std::string read_error(const std::string& file, ErrorCode* code = nullptr) {
    const std::string from_file = error_of(
        [&] {
          const SnapshotHeader h = read_snapshot_header(file);
          read_snapshot_payload(file, h);
        },
        code);
    if (fs::exists(file)) {
      const std::string bytes = bytes_of(file);
      const std::span<const uint8_t> in_memory(reinterpret_cast<const uint8_t*>(bytes.data()),
                                               bytes.size());
      EXPECT_EQ(error_of([&] {
                  const SnapshotHeader h = decode_snapshot_header(in_memory, file);
                  decode_snapshot_payload(in_memory, h, file);
                }),
                from_file);
      EXPECT_EQ(error_of([&] { verify_snapshot(in_memory, file); }), from_file);
    }
    return from_file;
  }
  template <typename F>
  static std::string error_of(F&& read, ErrorCode* code = nullptr) {
    try {
      read();
    } catch (const Error& e) {
      if (code != nullptr) *code = e.code();
      return e.what();
    }
    return "";
  }

  static std::string bytes_of(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }
  static void write_bytes(const std::string& file, const std::string& bytes) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << bytes;
  }

  fs::path dir_;
};

TEST_F(SnapshotFileTest, RoundTripKeepsMetadataTokensAndEveryPayloadByte) {
  const SnapshotMeta meta = test_meta(1000);
  // Three sections: 16 MiB, 16 MiB and the rest.
  const std::vector<uint8_t> payload = payload_of(2 * kSnapshotSectionBytes + 12345);
  write_snapshot(path("a.swkv"), meta, payload);

  const SnapshotHeader h = read_snapshot_header(path("a.swkv"));
  EXPECT_EQ(h.meta.binding, meta.binding);
  EXPECT_EQ(h.meta.tokens, meta.tokens);
  EXPECT_EQ(h.meta.payload_bytes, payload.size());
  EXPECT_EQ(h.meta.model_file, "test.gguf");
  EXPECT_EQ(h.meta.producer.rfind("swarmkv ", 0), 0u) << h.meta.producer;
  EXPECT_GT(h.meta.created_unix, 1700000000);
  ASSERT_EQ(h.sections.size(), 4u);
  EXPECT_EQ(h.sections[0].name, "tokens");
  EXPECT_EQ(h.sections[0].size, 4000u);
  EXPECT_EQ(h.sections[3].name, "kv.2");
  EXPECT_EQ(h.sections[3].size, 12345u);
  SnapshotReadTimes times;
  EXPECT_EQ(read_snapshot_payload(path("a.swkv"), h, &times), payload);
  EXPECT_GT(times.verify_ms, 0);
  // Nothing but the file is left in the folder.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

// The codec works in memory; a file is one sink for its bytes.
TEST_F(SnapshotFileTest, EncodedBytesAreTheFileWriteSnapshotWrites) {
  SnapshotMeta meta = test_meta(300);
  meta.created_unix = 1800000000;  // both encodings made in the same second
  const std::vector<uint8_t> payload = payload_of(kSnapshotSectionBytes + 100);
  const std::vector<uint8_t> encoded = encode_snapshot(meta, payload);
  write_snapshot(path("file.swkv"), meta, payload);
  const std::string file = bytes_of(path("file.swkv"));
  ASSERT_EQ(encoded.size(), file.size());
  EXPECT_TRUE(
      std::equal(encoded.begin(), encoded.end(), reinterpret_cast<const uint8_t*>(file.data())));
  write_snapshot_bytes(path("copy.swkv"), encoded);
  const SnapshotHeader h = read_snapshot_header(path("copy.swkv"));
  EXPECT_EQ(h.meta.tokens, meta.tokens);
  EXPECT_EQ(read_snapshot_payload(path("copy.swkv"), h), payload);
}

TEST_F(SnapshotFileTest, DecodingBytesInMemoryGivesWhatReadingTheFileGives) {
  const std::vector<uint8_t> payload = payload_of(2 * kSnapshotSectionBytes + 5);
  const std::vector<uint8_t> file = encode_snapshot(test_meta(300), payload);
  write_snapshot_bytes(path("file.swkv"), file);
  const SnapshotHeader from_file = read_snapshot_header(path("file.swkv"));
  const SnapshotHeader decoded = decode_snapshot_header(file, "bytes");
  EXPECT_EQ(decoded.meta.binding, from_file.meta.binding);
  EXPECT_EQ(decoded.meta.tokens, from_file.meta.tokens);
  EXPECT_EQ(decoded.meta.payload_bytes, payload.size());
  EXPECT_EQ(decoded.file_bytes, file.size());
  ASSERT_EQ(decoded.sections.size(), 4u);
  EXPECT_EQ(decode_snapshot_payload(file, decoded, "bytes"), payload);
  EXPECT_EQ(verify_snapshot(file, "bytes").meta.tokens, from_file.meta.tokens);
}

TEST_F(SnapshotFileTest, TruncationAtEverySectionBoundaryNamesTheSection) {
  const std::vector<uint8_t> payload = payload_of(kSnapshotSectionBytes + 100);
  write_snapshot(path("full.swkv"), test_meta(300), payload);
  const std::string full = bytes_of(path("full.swkv"));
  const SnapshotHeader h = read_snapshot_header(path("full.swkv"));
  ASSERT_EQ(h.sections.size(), 3u);
  const uint64_t size = full.size();

  // Cut exactly where each section starts, one byte into it, and one byte
  // before the end of the file.
  for (const SnapshotSection& s : h.sections) {
    for (const uint64_t cut : {s.offset, s.offset + 1}) {
      write_bytes(path("cut.swkv"), full.substr(0, cut));
      ErrorCode code{};
      const std::string error = read_error(path("cut.swkv"), &code);
      EXPECT_EQ(code, ErrorCode::kCorruption) << error;
      EXPECT_EQ(error, fmt::format("corruption: snapshot '{}': truncated: section '{}' needs bytes "
                                   "[{}, {}), the file has {}",
                                   path("cut.swkv"), s.name, s.offset, s.offset + s.size, cut));
    }
  }
  write_bytes(path("cut.swkv"), full.substr(0, size - 1));
  EXPECT_EQ(
      read_error(path("cut.swkv")),
      fmt::format("corruption: snapshot '{}': truncated: section 'kv.1' needs bytes [{}, {}), "
                  "the file has {}",
                  path("cut.swkv"), h.sections[2].offset, size, size - 1));
  // Inside the header.
  write_bytes(path("cut.swkv"), full.substr(0, 20));
  EXPECT_EQ(read_error(path("cut.swkv")),
            fmt::format("corruption: snapshot '{}': truncated in the header (20 bytes)",
                        path("cut.swkv")));
}

TEST_F(SnapshotFileTest, AFlippedByteAnywhereIsCorruptionNamingWhere) {
  write_snapshot(path("full.swkv"), test_meta(300), payload_of(kSnapshotSectionBytes + 100));
  const std::string full = bytes_of(path("full.swkv"));
  const SnapshotHeader h = read_snapshot_header(path("full.swkv"));
  const std::string flipped = path("flipped.swkv");
  const auto flip_at = [&](uint64_t at) {
    std::string bytes = full;
    bytes[at] = static_cast<char>(bytes[at] ^ 0x40);
    write_bytes(flipped, bytes);
    return read_error(flipped);
  };
  // The magic.
  EXPECT_EQ(flip_at(2),
            fmt::format("corruption: snapshot '{}': not a SwarmKV snapshot (no SWKVSNAP magic)",
                        flipped));
  // The metadata (JSON) and the section table are under the header checksum.
  for (const uint64_t at : {uint64_t{20}, h.sections[0].offset - 20}) {
    const std::string error = flip_at(at);
    EXPECT_TRUE(error.starts_with(
        fmt::format("corruption: snapshot '{}': header checksum mismatch (stored ", flipped)))
        << at << ": " << error;
  }
  // The tokens and each KV section have their own checksum.
  for (const SnapshotSection& s : h.sections) {
    const std::string error = flip_at(s.offset + s.size / 2);
    EXPECT_TRUE(error.starts_with(fmt::format(
        "corruption: snapshot '{}': checksum mismatch in section '{}' (stored ", flipped, s.name)))
        << error;
  }
}

TEST_F(SnapshotFileTest, EmptyFileForeignFileAndMissingFileAreRefusedPrecisely) {
  write_bytes(path("empty.swkv"), "");
  EXPECT_EQ(
      read_error(path("empty.swkv")),
      fmt::format("corruption: snapshot '{}': the file is empty (0 bytes)", path("empty.swkv")));
  write_bytes(path("text.swkv"), "hello, this is not a snapshot at all\n");
  EXPECT_EQ(read_error(path("text.swkv")),
            fmt::format("corruption: snapshot '{}': not a SwarmKV snapshot (no SWKVSNAP magic)",
                        path("text.swkv")));
  ErrorCode code{};
  EXPECT_EQ(read_error(path("missing.swkv"), &code),
            fmt::format("not_found: snapshot '{}' does not exist", path("missing.swkv")));
  EXPECT_EQ(code, ErrorCode::kNotFound);
}

TEST_F(SnapshotFileTest, ANewerFormatVersionIsIncompatibleNotCorrupt) {
  write_snapshot(path("v.swkv"), test_meta(10), payload_of(100));
  std::string bytes = bytes_of(path("v.swkv"));
  bytes[8] = 2;  // format version 2, then a valid header checksum over it
  const SnapshotHeader h = read_snapshot_header(path("v.swkv"));
  const size_t header_end = h.sections[0].offset;
  const uint64_t sum = [&] {
    // Recompute with the library's own rule: XXH3-64 of everything before it.
    write_bytes(path("v2.swkv"), bytes);
    try {
      read_snapshot_header(path("v2.swkv"));
    } catch (const Error& e) {
      const std::string m = e.message();
      const size_t at = m.find("computed ");
      return static_cast<uint64_t>(std::stoull(m.substr(at + 9, 16), nullptr, 16));
    }
    return uint64_t{0};
  }();
  for (int i = 0; i < 8; ++i)
    bytes[header_end - 8 + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
  write_bytes(path("v2.swkv"), bytes);
  ErrorCode code{};
  EXPECT_EQ(read_error(path("v2.swkv"), &code),
            fmt::format("incompatible: snapshot '{}' has format version 2, this build reads "
                        "version 1",
                        path("v2.swkv")));
  EXPECT_EQ(code, ErrorCode::kIncompatible);
}

// A hostile writer's file: section sizes chosen so that their sums wrap
// around 2^64 while the table still adds up to the file and the payload to
// the metadata, with the header checksum recomputed. Without the reader's
// wrap checks, verify_snapshot hashed 2^64 - 16 bytes of a buffer.
TEST_F(SnapshotFileTest, SectionSizesThatWrapAroundAreMalformedNotRead) {
  write_snapshot(path("s.swkv"), test_meta(10), payload_of(kSnapshotSectionBytes + 100));
  const SnapshotHeader h = read_snapshot_header(path("s.swkv"));
  ASSERT_EQ(h.sections.size(), 3u);
  std::string bytes = bytes_of(path("s.swkv"));
  const size_t header_end = h.sections[0].offset;
  constexpr size_t kRow = 16 + 4 + 3 * 8;  // name, codec, offset, size, xxh3
  const size_t table = header_end - 8 - 3 * kRow;
  const auto put_u64 = [&](size_t at, uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
  };
  // kv.0 claims 2^64 - 16 bytes; kv.1 starts there modulo 2^64 (16 bytes
  // before kv.0) and is as long as makes both sums come out right.
  const uint64_t wrapped = ~uint64_t{0} - 15;
  const SnapshotSection& kv0 = h.sections[1];
  put_u64(table + kRow + 28, wrapped);                                 // kv.0: size
  put_u64(table + 2 * kRow + 20, kv0.offset + wrapped);                // kv.1: offset
  put_u64(table + 2 * kRow + 28, kv0.size + h.sections[2].size + 16);  // kv.1: size
  // The header checksum, by the library's own rule (read from its message).
  write_bytes(path("wrap.swkv"), bytes);
  try {
    read_snapshot_header(path("wrap.swkv"));
  } catch (const Error& e) {
    const std::string m = e.message();
    ASSERT_NE(m.find("computed "), std::string::npos) << m;
    put_u64(header_end - 8, std::stoull(m.substr(m.find("computed ") + 9, 16), nullptr, 16));
  }
  write_bytes(path("wrap.swkv"), bytes);
  ErrorCode code{};
  const std::string error = read_error(path("wrap.swkv"), &code);
  EXPECT_EQ(code, ErrorCode::kCorruption) << error;
  EXPECT_EQ(error, fmt::format("corruption: snapshot '{}': section table row 1 is malformed "
                               "('kv.0', codec 0, offset {}, size {})",
                               path("wrap.swkv"), kv0.offset, wrapped));
}

// Numbers in the metadata are read as the file gives them: an integer its
// field's type holds, or corruption naming the field and the value. The
// file is rewritten with one metadata value changed (the producer shortened
// and the JSON padded with spaces so that no offset moves) and its header
// checksum recomputed. A plain get<int32_t>() read n_layer 2^40 as 0 and
// n_tokens 451.5 as 451.
TEST_F(SnapshotFileTest, MetadataNumbersOutsideTheirTypeAreCorruptionNamingTheValue) {
  write_snapshot(path("m.swkv"), test_meta(10), payload_of(100));
  const std::string original = bytes_of(path("m.swkv"));
  const size_t header_end = read_snapshot_header(path("m.swkv")).sections[0].offset;
  const auto meta_len = static_cast<size_t>(static_cast<uint8_t>(original[12]) |
                                            static_cast<uint8_t>(original[13]) << 8);
  ASSERT_EQ(original[14], 0);
  const auto rewritten = [&](const char* field, const nlohmann::json& value) {
    auto meta = nlohmann::json::parse(original.substr(16, meta_len));
    meta["producer"] = "";
    if (meta.contains(field)) {
      meta[field] = value;
    } else {
      meta["layout"][field] = value;
    }
    std::string text = meta.dump();
    EXPECT_LE(text.size(), meta_len);
    text.resize(meta_len, ' ');
    std::string bytes = original;
    bytes.replace(16, meta_len, text);
    const std::string file = path(fmt::format("{}.swkv", field));
    write_bytes(file, bytes);
    try {
      read_snapshot_header(file);
    } catch (const Error& e) {
      const std::string m = e.message();
      if (m.find("computed ") == std::string::npos) return file;  // the checksum still held
      const uint64_t sum = std::stoull(m.substr(m.find("computed ") + 9, 16), nullptr, 16);
      for (int i = 0; i < 8; ++i) {
        bytes[header_end - 8 + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
      }
    }
    write_bytes(file, bytes);
    return file;
  };
  // The rewrite itself keeps a valid file.
  EXPECT_EQ(read_snapshot_header(rewritten("model_file", "test.gguf")).meta.tokens.size(), 10u);
  const auto refused = [&](const char* field, const nlohmann::json& value,
                           const std::string& range) {
    const std::string file = rewritten(field, value);
    ErrorCode code{};
    EXPECT_EQ(read_error(file, &code),
              fmt::format("corruption: snapshot '{}': unreadable metadata: '{}' is {}, not an "
                          "integer in {}",
                          file, field, value.dump(), range));
    EXPECT_EQ(code, ErrorCode::kCorruption);
  };
  refused("n_layer", uint64_t{1} << 40, "[-2147483648, 2147483647]");
  refused("n_ubatch", -1, "[0, 4294967295]");
  refused("n_tokens", 451.5, "[0, 18446744073709551615]");
  refused("payload_bytes", "100", "[0, 18446744073709551615]");
  refused("created_unix", true, "[-9223372036854775808, 9223372036854775807]");
}

std::string binding_error(const SnapshotBinding& snapshot) {
  try {
    check_binding("s.swkv", snapshot, test_binding());
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIncompatible);
    return e.what();
  }
  return "";
}

TEST(SnapshotBindingTest, EveryMismatchNamesWhatTheSnapshotWasMadeForAndWhatThisRunHas) {
  EXPECT_EQ(binding_error(test_binding()), "");
  SnapshotBinding b = test_binding();
  b.model_sha256 = std::string(64, 'b');
  EXPECT_EQ(binding_error(b),
            fmt::format("incompatible: snapshot 's.swkv' was made for the model with sha256 {}, "
                        "this run has {}",
                        std::string(64, 'b'), std::string(64, 'a')));
  b = test_binding();
  b.engine = "deadbeef+p0";
  EXPECT_EQ(binding_error(b),
            "incompatible: snapshot 's.swkv' was made for engine deadbeef+p0, this run has "
            "0c1e57098+pe3f6dd2ca631");
  b = test_binding();
  b.layout.n_embd_k = 256;
  EXPECT_EQ(binding_error(b),
            "incompatible: snapshot 's.swkv' was made for n_embd_k 256, this run has 192");
  b = test_binding();
  b.layout.type_v = "q8_0";
  EXPECT_EQ(binding_error(b),
            "incompatible: snapshot 's.swkv' was made for type_v q8_0, this run has f16");
  b = test_binding();
  b.layout.n_ubatch = 256;
  EXPECT_EQ(binding_error(b),
            "incompatible: snapshot 's.swkv' was made for n_ubatch 256, this run has 512");
  b = test_binding();  // made by the batch-invariant attention kernel, restored into another
  b.layout.attention_invariant = true;
  EXPECT_EQ(binding_error(b),
            "incompatible: snapshot 's.swkv' was made for attention_invariant true, this run has "
            "false");
  b = test_binding();  // K/V computed on a GPU, restored on the CPU
  b.layout.offloaded_layers = 30;
  EXPECT_EQ(binding_error(b),
            "incompatible: snapshot 's.swkv' was made for offloaded_layers (K/V computed on a "
            "GPU) 30, this run has 0");
}

// The layout reads back as written, and a file from before a key reads it
// as false: it cannot say its kernels were batch-invariant.
TEST(SnapshotBindingTest, TheLayoutRoundTripsAndOlderFilesAreNotInvariant) {
  KvLayout l = test_binding().layout;
  l.batch_invariant = true;
  l.attention_invariant = true;
  EXPECT_EQ(kv_layout_from_json(kv_layout_json(l)), l);
  nlohmann::json older = kv_layout_json(l);
  older.erase("batch_invariant");
  older.erase("attention_invariant");
  const KvLayout read = kv_layout_from_json(older);
  EXPECT_FALSE(read.batch_invariant);
  EXPECT_FALSE(read.attention_invariant);
  // A CPU state's layout has no offloaded_layers key, so its store key is
  // the one it had before GPU runs were bound.
  EXPECT_FALSE(kv_layout_json(l).contains("offloaded_layers"));
  l.offloaded_layers = 12;
  EXPECT_EQ(kv_layout_json(l).at("offloaded_layers"), 12);
  EXPECT_EQ(kv_layout_from_json(kv_layout_json(l)), l);
}

TEST(SnapshotKeyTest, KeyChangesWithAnyBoundFieldAndAnyToken) {
  const SnapshotMeta m = test_meta(50);
  const std::string key = snapshot_key(m.binding, m.tokens);
  EXPECT_EQ(key.size(), 32u);
  EXPECT_EQ(key, snapshot_key(m.binding, m.tokens));
  std::vector<Token> other = m.tokens;
  other.back() += 1;
  EXPECT_NE(key, snapshot_key(m.binding, other));
  other.pop_back();
  EXPECT_NE(key, snapshot_key(m.binding, other));
  SnapshotBinding b = m.binding;
  b.layout.flash_attn = true;
  EXPECT_NE(key, snapshot_key(b, m.tokens));
  b = m.binding;
  b.layout.attention_invariant = true;
  EXPECT_NE(key, snapshot_key(b, m.tokens));
  b = m.binding;
  b.layout.offloaded_layers = 1;
  EXPECT_NE(key, snapshot_key(b, m.tokens));
  b = m.binding;
  b.engine += "x";
  EXPECT_NE(key, snapshot_key(b, m.tokens));
}

TEST(SnapshotOptionsTest, SizesAndModesParseOrNameTheBadValue) {
  EXPECT_EQ(parse_byte_size("4G"), 4ull << 30);
  EXPECT_EQ(parse_byte_size("512M"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_byte_size("1048576"), 1048576u);
  for (const char* bad : {"", "G", "4X", "-1", "4GG", "99999999999999999999"}) {
    try {
      parse_byte_size(bad);
      ADD_FAILURE() << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.what(), fmt::format("invalid_argument: '{}' is not a size (bytes, or a number "
                                      "with K, M, G or T)",
                                      bad));
    }
  }
  EXPECT_EQ(parse_snapshot_cache_mode("read-only"), SnapshotCacheMode::kReadOnly);
  EXPECT_EQ(to_string(SnapshotCacheMode::kOn), "on");
  try {
    parse_snapshot_cache_mode("yes");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "invalid_argument: unknown snapshot cache mode 'yes' (expected on, off or "
                 "read-only)");
  }
}

TEST(PrefixReuseTest, ReuseIsExactMatchOrWholeChunksAndNeverPartialOnSlidingWindowModels) {
  KvLayout plain = test_binding().layout;  // n_ubatch 512, no sliding window
  EXPECT_EQ(detail::reusable_tokens(3592, 3592, 3592, plain), 3592u);  // exact
  EXPECT_EQ(detail::reusable_tokens(3590, 3592, 3700, plain), 3584u);  // appended: 7 chunks
  EXPECT_EQ(detail::reusable_tokens(3592, 3592, 3700, plain),
            3584u);  // a prefix, not chunk-aligned
  EXPECT_EQ(detail::reusable_tokens(1024, 1024, 2000, plain), 1024u);
  EXPECT_EQ(detail::reusable_tokens(511, 3592, 3700, plain), 0u);      // less than one chunk
  EXPECT_EQ(detail::reusable_tokens(2000, 3592, 2000, plain), 1536u);  // a shorter document
  KvLayout swa = plain;
  swa.n_swa = 512;
  EXPECT_EQ(detail::reusable_tokens(3592, 3592, 3592, swa), 3592u);
  EXPECT_EQ(detail::reusable_tokens(3590, 3592, 3700, swa), 0u);
}

class SnapshotStoreTest : public SnapshotFileTest {};

TEST_F(SnapshotStoreTest, ExactKeyWinsThenTheLongestCommonPrefixOfTheSameBinding) {
  SnapshotStore store(dir_.string(), 1ull << 30);
  const SnapshotMeta a = test_meta(600);
  store.publish(a, payload_of(1000));
  SnapshotMeta longer = test_meta(700);
  store.publish(longer, payload_of(1000));
  SnapshotMeta other_model = test_meta(800);
  other_model.binding.model_sha256 = std::string(64, 'c');
  store.publish(other_model, payload_of(1000));

  // Exact.
  auto m = store.best_match(a.binding, a.tokens, 1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->entry.key, snapshot_key(a.binding, a.tokens));
  EXPECT_EQ(m->common_tokens, 600u);
  // 750 tokens extending both: the 700-token entry shares more.
  std::vector<Token> request = test_meta(750).tokens;
  m = store.best_match(a.binding, request, 1);
  ASSERT_TRUE(m);
  EXPECT_EQ(m->common_tokens, 700u);
  EXPECT_EQ(m->entry.path, store.path_of(snapshot_key(longer.binding, longer.tokens)));
  // A different first token: nothing in common.
  EXPECT_FALSE(store.best_match(a.binding, test_meta(600, 99).tokens, 1));
  // The other model's entry is never offered.
  SnapshotBinding c = a.binding;
  c.model_sha256 = std::string(64, 'd');
  EXPECT_FALSE(store.best_match(c, request, 1));
}

TEST_F(SnapshotStoreTest, DamagedEntriesAreReportedNotMatched) {
  SnapshotStore store(dir_.string(), 1ull << 30);
  const SnapshotMeta a = test_meta(600);
  const std::string p = store.publish(a, payload_of(1000));
  std::string bytes = bytes_of(p);
  bytes[30] = static_cast<char>(bytes[30] ^ 1);
  write_bytes(p, bytes);
  std::vector<SnapshotStore::Entry> bad;
  EXPECT_FALSE(store.best_match(a.binding, a.tokens, 1, &bad));
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_EQ(bad[0].path, p);
  ASSERT_TRUE(bad[0].error);
  EXPECT_EQ(bad[0].error->code, ErrorCode::kCorruption);
}

TEST_F(SnapshotStoreTest, PublishingEvictsTheLeastRecentlyUsedAboveTheCap) {
  // Each entry is ~100 KB; the cap holds two.
  SnapshotStore store(dir_.string(), 250'000);
  std::vector<std::string> paths;
  for (int i = 0; i < 3; ++i) {
    paths.push_back(store.publish(test_meta(100, 1000 * i), payload_of(100'000)));
    // Distinct last-use times, oldest first; then entry 0 is used again.
    fs::last_write_time(paths.back(),
                        fs::file_time_type::clock::now() - std::chrono::hours(10 - i));
  }
  // Publishing the third evicted the oldest one (0).
  EXPECT_FALSE(fs::exists(paths[0]));
  EXPECT_TRUE(fs::exists(paths[1]));
  EXPECT_TRUE(fs::exists(paths[2]));
  store.touch(paths[1]);  // now the most recent
  paths.push_back(store.publish(test_meta(100, 5000), payload_of(100'000)));
  EXPECT_TRUE(fs::exists(paths[1]));
  EXPECT_FALSE(fs::exists(paths[2]));
  EXPECT_TRUE(fs::exists(paths[3]));
}

TEST_F(SnapshotStoreTest, GcEvictsToTheCapAndRemovesOnlyStaleTemporaries) {
  SnapshotStore store(dir_.string(), 1ull << 30);
  const std::string a = store.publish(test_meta(100, 1), payload_of(100'000));
  fs::last_write_time(a, fs::file_time_type::clock::now() - std::chrono::hours(2));
  const std::string b = store.publish(test_meta(100, 500), payload_of(100'000));
  write_bytes(path(".tmp-stale"), "x");
  fs::last_write_time(path(".tmp-stale"), fs::file_time_type::clock::now() - std::chrono::hours(2));
  write_bytes(path(".tmp-live"), "x");  // a writer at work: kept
  const SnapshotStore::GcReport r = store.gc(150'000);
  EXPECT_EQ(r.entries_removed, 1);
  EXPECT_EQ(r.temporaries_removed, 1);
  EXPECT_FALSE(fs::exists(a));
  EXPECT_TRUE(fs::exists(b));
  EXPECT_FALSE(fs::exists(path(".tmp-stale")));
  EXPECT_TRUE(fs::exists(path(".tmp-live")));
}

TEST_F(SnapshotStoreTest, AdoptStoresOnlyVerifiedBytesOfItsKey) {
  SnapshotStore store(dir_.string(), 1ull << 30);
  const SnapshotMeta meta = test_meta(200);
  const std::string key = snapshot_key(meta.binding, meta.tokens);
  const std::vector<uint8_t> file = encode_snapshot(meta, payload_of(5000));
  const auto adopt_error = [&](const std::string& as, std::vector<uint8_t> bytes) {
    try {
      store.adopt(as, bytes);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption) << e.what();
      EXPECT_FALSE(fs::exists(store.path_of(as))) << "a refused file reached the store";
      return std::string(e.what());
    }
    return std::string();
  };
  std::vector<uint8_t> damaged = file;
  damaged.at(damaged.size() - 10) ^= 1;  // in the KV payload
  EXPECT_TRUE(adopt_error(key, damaged)
                  .starts_with(fmt::format(
                      "corruption: snapshot {}: snapshot '{}': checksum mismatch in section 'kv.0'",
                      key, store.path_of(key))));
  const std::string other = snapshot_key(meta.binding, test_meta(201).tokens);
  EXPECT_EQ(adopt_error(other, file),
            fmt::format("corruption: snapshot {}: the snapshot received for key {} is the "
                        "snapshot of key {}",
                        other, other, key));
  EXPECT_EQ(adopt_error(key, {}),
            fmt::format("corruption: snapshot {}: snapshot '{}': the file is empty (0 bytes)", key,
                        store.path_of(key)));
  const std::string stored = store.adopt(key, file);
  EXPECT_EQ(stored, store.path_of(key));
  const std::string on_disk = bytes_of(stored);
  EXPECT_TRUE(std::equal(file.begin(), file.end(), on_disk.begin(), on_disk.end(),
                         [](uint8_t a, char b) { return a == static_cast<uint8_t>(b); }));
}

TEST_F(SnapshotStoreTest, TwoProcessesPublishingOneKeyLeaveOneValidFileAndNoTemporaries) {
  const SnapshotMeta meta = test_meta(2000);
  const std::vector<uint8_t> payload = payload_of(3 * kSnapshotSectionBytes / 2);
  // Both children start writing the same key at once, three times each.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      char go = 0;
      ::close(ready[1]);
      if (::read(ready[0], &go, 1) != 1) ::_exit(3);
      try {
        SnapshotStore store(dir_.string(), 1ull << 30);
        for (int i = 0; i < 3; ++i) store.publish(meta, payload);
      } catch (...) {
        ::_exit(2);
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  ::close(ready[0]);
  ASSERT_EQ(::write(ready[1], "gg", 2), 2);
  ::close(ready[1]);
  // Meanwhile this process reads the key as a reader would: it may find no
  // file yet, never a part of one (a writer that wrote in place would be
  // caught here as a truncated file).
  const std::string final_path =
      (dir_ / (snapshot_key(meta.binding, meta.tokens) + ".swkv")).string();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  size_t exited = 0;
  while (exited < children.size() && std::chrono::steady_clock::now() < deadline) {
    try {
      const SnapshotHeader h = read_snapshot_header(final_path);
      EXPECT_EQ(read_snapshot_payload(final_path, h), payload);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    }
    for (pid_t& pid : children) {
      int status = 0;
      if (pid > 0 && ::waitpid(pid, &status, WNOHANG) == pid) {
        EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
        pid = -1;
        ++exited;
      }
    }
  }
  ASSERT_EQ(exited, children.size()) << "the writers did not finish within 60 s";
  std::vector<std::string> files;
  for (const auto& d : fs::directory_iterator(dir_)) files.push_back(d.path().filename().string());
  ASSERT_EQ(files.size(), 1u) << fmt::format("{}", fmt::join(files, ", "));
  EXPECT_EQ(files[0], snapshot_key(meta.binding, meta.tokens) + ".swkv");
  const SnapshotHeader h = read_snapshot_header((dir_ / files[0]).string());
  EXPECT_EQ(read_snapshot_payload((dir_ / files[0]).string(), h), payload);
}

}  // namespace
}  // namespace swarmkv
