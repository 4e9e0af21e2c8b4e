// Bounded random-input tests of the parsers others feed: the pipeline-file
// loader and the command line (a user), the snapshot reader (a file anyone
// could have written, its checksums resealed), the cluster's manifests, run
// specs and results (whoever can write to Redis) and the OpenAI request body
// (whoever reaches the port). Each mutates seeds (tests/fuzz/, or valid
// messages made here) with byte edits and tokens of its format, a fixed
// number of inputs from a fixed seed, and requires that every input either
// parses or fails with a swarmkv::Error: no other exception, crash, hang or
// sanitizer report. $SWARMKV_FUZZ_INPUTS overrides the count (default
// 10,000 each), $SWARMKV_FUZZ_SEED the seed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>
#include <xxhash.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "cluster/keys.h"
#include "server/openai.h"
#include "spec_fixtures.h"
#include "swarmkv/cluster.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace {

size_t inputs() {
  const char* v = std::getenv("SWARMKV_FUZZ_INPUTS");
  return v != nullptr && std::atol(v) > 0 ? static_cast<size_t>(std::atol(v)) : 10000;
}
uint32_t seed() {
  const char* v = std::getenv("SWARMKV_FUZZ_SEED");
  return v != nullptr ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : 20261201u;
}

class FuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("swarmkv_fuzz_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_ / "cache");
    std::ofstream(dir_ / "doc.txt") << "A short document for the fuzzer.";
    for (const auto& e : std::filesystem::directory_iterator(
             std::filesystem::path(SWARMKV_SOURCE_DIR) / "tests" / "fuzz")) {
      corpus_.push_back(read_file(e.path().string()));
    }
    ASSERT_GE(corpus_.size(), 3u);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path dir_;
  std::vector<std::string> corpus_;
};

// Tokens that YAML, our keys and our value checks care about.
const std::vector<std::string> kYamlTokens = {":",          " ",           "\n",
                                              "\n  ",       "- ",          "{",
                                              "}",          "[",           "]",
                                              ",",          "\"",          "'",
                                              "#",          "&a ",         "*a",
                                              "<<: *a",     "!!binary",    "!!str ",
                                              "? ",         "|",           ">",
                                              "~",          "null",        "",
                                              "\\0",        "\\x00",       "\xff",
                                              "\xc3",       "-1",          "0",
                                              "1e309",      ".nan",        ".inf",
                                              "-.inf",      "99999999999", "name",
                                              "prompt",     "agents",      "document",
                                              "text",       "file",        "defaults",
                                              "max_tokens", "stop",        "depends_on",
                                              "fork",       "threads",     "n_batch",
                                              "n_ctx",      "temperature", "document.txt",
                                              "doc.txt",    "/",           "..",
                                              "none",       "shared",      "{{a}}",
                                              "\t",         "\r\n",        "---\n",
                                              "...\n",      "%YAML 1.2\n"};

std::string mutate(std::string s, std::mt19937& rng, const std::vector<std::string>& tokens) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    const size_t at = s.empty() ? 0 : rng() % (s.size() + 1);
    switch (rng() % 5) {
      case 0:  // flip a byte
        if (!s.empty()) s[at % s.size()] = static_cast<char>(rng() % 256);
        break;
      case 1:  // delete a run
        if (!s.empty()) s.erase(at % s.size(), 1 + rng() % 16);
        break;
      case 2:  // duplicate a run
        if (!s.empty()) s.insert(at, s.substr(at % s.size(), 1 + rng() % 32));
        break;
      default:  // insert a token
        s.insert(at, tokens[rng() % tokens.size()]);
        break;
    }
  }
  return s;
}

TEST_F(FuzzTest, PipelineLoaderOnlyEverThrowsErrors) {
  std::mt19937 rng(seed());
  const auto start = std::chrono::steady_clock::now();
  size_t parsed = 0;
  size_t refused = 0;
  for (size_t i = 0; i < inputs(); ++i) {
    const std::string text = mutate(corpus_[rng() % corpus_.size()], rng, kYamlTokens);
    try {
      parse_pipeline(text, "fuzz", dir_.string());
      ++parsed;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      FAIL() << "input " << i << " threw a non-swarmkv exception: " << e.what() << "\n---\n"
             << text << "\n---";
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[fuzz] pipeline loader: " << inputs() << " inputs (seed " << seed() << "), "
            << parsed << " parsed, " << refused << " refused, " << s << " s\n";
  EXPECT_GT(parsed, 0u) << "the mutations must leave some inputs valid";
  EXPECT_GT(refused, 0u);
}

// Arguments that never reach a model: $SWARMKV_MODEL names no file, and the
// only files are a text document and the temporary cache.
TEST_F(FuzzTest, CommandLineOnlyEverExitsWithAStatus) {
  ::setenv("SWARMKV_MODEL", "/nonexistent/model.gguf", 1);
  ::setenv("SWARMKV_CACHE", (dir_ / "cache").c_str(), 1);
  const std::string doc = (dir_ / "doc.txt").string();
  const std::string pipeline = (dir_ / "p.yaml").string();
  std::ofstream(pipeline) << "document: {file: doc.txt}\nagents: [{name: a, prompt: q}]\n";
  const std::vector<std::string> words = {"generate",
                                          "run",
                                          "bench",
                                          "prefill",
                                          "snapshot",
                                          "info",
                                          "ls",
                                          "verify",
                                          "rm",
                                          "gc",
                                          "--all",
                                          "--json",
                                          "--check",
                                          "--help",
                                          "-m",
                                          "--model",
                                          "-p",
                                          "--prompt",
                                          "-f",
                                          "--prompt-file",
                                          "-n",
                                          "-t",
                                          "--threads",
                                          "--temp",
                                          "--stop",
                                          "--fork",
                                          "--guard",
                                          "--n-ctx",
                                          "-c",
                                          "--snapshot-cache",
                                          "--snapshot",
                                          "--cache-dir",
                                          "--out",
                                          "--pause-ms",
                                          "--trials",
                                          "--arms",
                                          "--sweep",
                                          "--log-level",
                                          "--raw",
                                          "--seed",
                                          "shared",
                                          "host",
                                          "none",
                                          "on",
                                          "off",
                                          "read-only",
                                          "debug",
                                          "-1",
                                          "0",
                                          "1",
                                          "1000",
                                          "nan",
                                          "inf",
                                          "1e309",
                                          "",
                                          "=",
                                          "--",
                                          "-",
                                          "\xff",
                                          doc,
                                          pipeline,
                                          dir_.string(),
                                          "/nonexistent",
                                          "branches=1,2",
                                          "doc-tokens=x"};
  std::mt19937 rng(seed() + 1);
  std::ostringstream sink;
  std::streambuf* out = std::cout.rdbuf(sink.rdbuf());
  std::streambuf* err = std::cerr.rdbuf(sink.rdbuf());
  const auto start = std::chrono::steady_clock::now();
  std::map<int, size_t> statuses;
  for (size_t i = 0; i < inputs(); ++i) {
    std::vector<std::string> args = {"swarmkv"};
    const size_t n = rng() % 7;
    for (size_t k = 0; k < n; ++k) {
      std::string w = words[rng() % words.size()];
      if (rng() % 8 == 0) w = mutate(w, rng, words);
      args.push_back(w);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const int status = cli::run(static_cast<int>(args.size()), argv.data());
    ++statuses[status];
    if (status == cli::kExitFailed && std::getenv("SWARMKV_FUZZ_SHOW_FAILED") != nullptr) {
      std::string line;
      for (const std::string& a : args) line += " '" + a + "'";
      std::fprintf(stderr, "[fuzz] exit 1 for%s: %s\n", line.c_str(), sink.str().c_str());
    }
    set_log_level(LogLevel::kWarn);
    sink.str("");
    sink.clear();
    std::cout.clear();
    if (status != cli::kExitOk && status != cli::kExitFailed && status != cli::kExitUsage) {
      std::cout.rdbuf(out);
      std::cerr.rdbuf(err);
      std::string line;
      for (const std::string& a : args) line += " '" + a + "'";
      FAIL() << "exit status " << status << " for" << line;
    }
  }
  std::cout.rdbuf(out);
  std::cerr.rdbuf(err);
  ::unsetenv("SWARMKV_MODEL");
  ::unsetenv("SWARMKV_CACHE");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[fuzz] command line: " << inputs() << " inputs (seed " << seed() << "), exit "
            << "0: " << statuses[0] << ", 1: " << statuses[1] << ", 2: " << statuses[2] << ", " << s
            << " s\n";
  EXPECT_GT(statuses[cli::kExitUsage], 0u);
}

// ------------------------------------------------------------ what others write

// Tokens that JSON, our keys and our range checks care about.
const std::vector<std::string> kJsonTokens = {"{",
                                              "}",
                                              "[",
                                              "]",
                                              ",",
                                              ":",
                                              "\"",
                                              "\\",
                                              "null",
                                              "true",
                                              "false",
                                              "-1",
                                              "0",
                                              "1.5",
                                              "1e309",
                                              "-0",
                                              "18446744073709551616",
                                              "18446744073709551615",
                                              "9223372036854775808",
                                              "2147483648",
                                              "-9223372036854775809",
                                              "\"\\u0000\"",
                                              "\xff",
                                              "\xc3",
                                              " ",
                                              "\"key\"",
                                              "\"bytes\"",
                                              "\"chunk_bytes\"",
                                              "\"chunk_xxh3\"",
                                              "\"upload\"",
                                              "\"messages\"",
                                              "\"role\"",
                                              "\"content\"",
                                              "\"max_tokens\"",
                                              "\"n\"",
                                              "\"stop\"",
                                              "\"temperature\"",
                                              "\"stream\"",
                                              "\"tokens\"",
                                              "\"status\"",
                                              "\"error\"",
                                              "\"code\"",
                                              "\"pipeline\"",
                                              "\"agents\"",
                                              "\"document\"",
                                              "\"layout\"",
                                              "\"n_tokens\"",
                                              "\"payload_bytes\"",
                                              "\"n_layer\"",
                                              "\"n_embd_k\"",
                                              "\"type_k\"",
                                              "\"engine\"",
                                              "\"timings_ms\"",
                                              "\"token_at_ms\"",
                                              "\"guard\""};

// A structural edit of JSON text that parses: a value somewhere replaced by
// one of another type or range, or a member removed, so that the readers'
// type and range checks are reached, not only the JSON parser's.
std::string mutate_json(const std::string& text, std::mt19937& rng) {
  nlohmann::json root = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return text;
  static const std::vector<nlohmann::json> kValues = {nullptr,
                                                      true,
                                                      -1,
                                                      0,
                                                      1.5,
                                                      1e300,
                                                      "",
                                                      "x",
                                                      nlohmann::json::array(),
                                                      nlohmann::json::object(),
                                                      nlohmann::json::array({1, "a"}),
                                                      nlohmann::json::object({{"a", 1}}),
                                                      std::numeric_limits<int64_t>::min(),
                                                      std::numeric_limits<uint64_t>::max(),
                                                      uint64_t{1} << 40,
                                                      int64_t{2147483648}};
  const int edits = 1 + static_cast<int>(rng() % 3);
  for (int e = 0; e < edits; ++e) {
    nlohmann::json* at = &root;
    while ((at->is_object() || at->is_array()) && !at->empty() && rng() % 4 != 0) {
      auto it = at->begin();
      std::advance(it, static_cast<std::ptrdiff_t>(rng() % at->size()));
      at = &*it;
    }
    *at = kValues[rng() % kValues.size()];
  }
  for (int e = 0; e < 1 && root.is_object() && !root.empty() && rng() % 3 == 0; ++e) {
    auto it = root.begin();
    std::advance(it, static_cast<std::ptrdiff_t>(rng() % root.size()));
    root.erase(it);
  }
  return root.dump();
}

// Every mutation of `seeds` through `parse` (byte and token edits, and for
// `json` as many structural ones): parsed, or a swarmkv::Error; anything else fails
// the test with the input. Returns {parsed, refused}.
template <typename Parse>
std::pair<size_t, size_t> fuzz_text(const std::vector<std::string>& seeds, uint32_t from,
                                    const char* what, Parse&& parse, bool json = true) {
  std::mt19937 rng(from);
  size_t parsed = 0;
  size_t refused = 0;
  for (size_t i = 0; i < inputs(); ++i) {
    const std::string& from_seed = seeds[rng() % seeds.size()];
    const std::string text =
        !json || rng() % 2 == 0 ? mutate(from_seed, rng, kJsonTokens) : mutate_json(from_seed, rng);
    try {
      parse(text);
      ++parsed;
    } catch (const Error&) {
      ++refused;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << ": input " << i << " threw a non-swarmkv exception: " << e.what()
                    << "\n---\n"
                    << text << "\n---";
      break;
    }
  }
  std::cout << "[fuzz] " << what << ": " << inputs() << " inputs (seed " << from << "), " << parsed
            << " parsed, " << refused << " refused\n";
  return {parsed, refused};
}

// JSON text as a message reader gets it from Redis: text that does not
// parse as JSON at all is the caller's refusal (the worker and the
// coordinator catch the parser's exception as a damaged message).
nlohmann::json json_or_refused(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw Error(ErrorCode::kCorruption, "not JSON");
  return j;
}

TEST(MessageFuzzTest, ClusterMessagesOnlyEverThrowErrors) {
  cluster::Manifest m;
  m.key = "k";
  m.upload = "u1";
  m.bytes = 10'000;
  m.chunk_bytes = 4096;
  m.chunk_xxh3 = {1, 2, 3};
  m.producer = "swarmkv test";
  m.created_unix = 1;
  const auto [manifests, bad_manifests] =
      fuzz_text({cluster::manifest_to_json(m)}, seed() + 2, "manifest",
                [](const std::string& t) { cluster::manifest_from_json(t, "k"); });
  EXPECT_GT(manifests, 0u);
  EXPECT_GT(bad_manifests, 0u);

  const auto [specs, bad_specs] = fuzz_text(
      {cluster::spec_to_json(fixtures::spec_with_every_field_set(), GuardPolicy::kConcurrent)
           .dump(),
       cluster::spec_to_json(fixtures::exact_variant(fixtures::spec_with_every_field_set()),
                             GuardPolicy::kSerialized)
           .dump()},
      seed() + 3, "run spec",
      [](const std::string& t) { cluster::spec_from_json(json_or_refused(t), nullptr); });
  EXPECT_GT(specs, 0u);
  EXPECT_GT(bad_specs, 0u);

  AgentResult ok;
  ok.name = "a";
  ok.status = NodeStatus::kOk;
  ok.answer = "An answer.";
  ok.tokens = {1, 2, 3};
  ok.token_at_ms = {1.0, 2.0, 3.0};
  ok.worker = "w1";
  AgentResult failed;
  failed.name = "b";
  failed.status = NodeStatus::kFailed;
  failed.error = ErrorValue{ErrorCode::kCorruption, "a reason"};
  const auto [results, bad_results] =
      fuzz_text({agent_json(ok).dump(), agent_json(failed).dump()}, seed() + 4, "agent result",
                [](const std::string& t) { agent_from_json(json_or_refused(t)); });
  EXPECT_GT(results, 0u);
  EXPECT_GT(bad_results, 0u);
}

TEST(MessageFuzzTest, ChatRequestParserOnlyEverThrowsErrors) {
  const std::vector<std::string> seeds = {
      R"({"model": "m", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hello"}], "max_tokens": 8, "temperature": 0.5, "top_p": 0.9,
          "stop": ["\n"], "n": 2, "stream": true, "seed": 7})",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
          "stream_options": {"include_usage": true}, "max_completion_tokens": 4})"};
  const auto [parsed, refused] = fuzz_text(
      seeds, seed() + 5, "chat request",
      [](const std::string& t) { server::parse_chat_request(t, server::RequestLimits{}); });
  EXPECT_GT(parsed, 0u);
  EXPECT_GT(refused, 0u);
}

// The legacy completions body: prompts as strings, lists of them, token
// ids and lists of ids, echo and logprobs.
TEST(MessageFuzzTest, CompletionRequestParserOnlyEverThrowsErrors) {
  const std::vector<std::string> seeds = {
      R"({"model": "m", "prompt": "Once upon", "max_tokens": 8, "echo": true, "logprobs": 2,
          "n": 2, "stream": true, "stop": "\n"})",
      R"({"prompt": ["A", "B"], "best_of": 1, "suffix": null, "seed": 3})",
      R"({"prompt": [1, 2, 3], "echo": false, "logprobs": 0})",
      R"({"prompt": [[1, 2], [3]], "temperature": 0, "user": "u"})"};
  const auto [parsed, refused] = fuzz_text(
      seeds, seed() + 6, "completion request",
      [](const std::string& t) { server::parse_completion_request(t, server::RequestLimits{}); });
  EXPECT_GT(parsed, 0u);
  EXPECT_GT(refused, 0u);
}

// A snapshot file with other metadata and every checksum recomputed: what
// someone who can write to a store or to Redis can make.
std::vector<uint8_t> reseal(const std::vector<uint8_t>& file, const std::string& meta) {
  const auto u32 = [&](size_t at) {
    uint32_t v = 0;
    std::memcpy(&v, file.data() + at, 4);
    return v;
  };
  const uint32_t m = u32(12);
  const uint32_t sections = u32(16 + m);
  const size_t header_end = 20 + size_t{m} + 44 * size_t{sections};
  const uint64_t shift = meta.size() - m;  // modulo 2^64: offsets move by the length change
  std::vector<uint8_t> out(file.begin(), file.begin() + 12);
  const auto put = [&](const void* p, size_t n) {
    out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  const auto meta_size = static_cast<uint32_t>(meta.size());
  put(&meta_size, 4);
  put(meta.data(), meta.size());
  put(&sections, 4);
  for (uint32_t i = 0; i < sections; ++i) {
    const size_t row = 20 + size_t{m} + 44 * size_t{i};
    uint64_t offset = 0;
    std::memcpy(&offset, file.data() + row + 20, 8);
    offset += shift;
    put(file.data() + row, 20);
    put(&offset, 8);
    put(file.data() + row + 28, 16);
  }
  const uint64_t sum = XXH3_64bits(out.data(), out.size());
  put(&sum, 8);
  out.insert(out.end(), file.begin() + static_cast<std::ptrdiff_t>(header_end + 8), file.end());
  return out;
}

TEST(MessageFuzzTest, SnapshotReaderOnlyEverThrowsErrors) {
  SnapshotMeta meta;
  meta.binding.engine = "0c1e57098+pe3f6dd2ca631";
  meta.binding.state_version = 10;
  meta.binding.model_sha256 = std::string(64, 'a');
  meta.binding.layout = {"llama", 30, 192, 192, "q8_0", "q8_0", true, false, 0, 256};
  meta.tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  meta.model_file = "test.gguf";
  std::vector<uint8_t> payload(4096);
  std::mt19937 fill(1);
  for (uint8_t& b : payload) b = static_cast<uint8_t>(fill());
  const std::vector<uint8_t> file = encode_snapshot(meta, payload);
  ASSERT_NO_THROW(verify_snapshot(file, "seed"));
  uint32_t m = 0;
  std::memcpy(&m, file.data() + 12, 4);
  const std::string metadata(file.begin() + 16, file.begin() + 16 + m);
  ASSERT_EQ(verify_snapshot(reseal(file, metadata), "resealed").meta.tokens, meta.tokens);

  // The metadata, resealed: every input reaches the metadata's reader.
  const auto [parsed, refused] =
      fuzz_text({metadata}, seed() + 6, "snapshot metadata",
                [&](const std::string& t) { verify_snapshot(reseal(file, t), "fuzz"); });
  EXPECT_GT(parsed, 0u);
  EXPECT_GT(refused, 0u);
  // The whole file's bytes, checksums as they fall: the header's framing.
  const std::string whole(file.begin(), file.end());
  const auto [intact, broken] = fuzz_text(
      {whole}, seed() + 7, "snapshot bytes",
      [](const std::string& t) {
        verify_snapshot(std::span(reinterpret_cast<const uint8_t*>(t.data()), t.size()), "fuzz");
      },
      /*json=*/false);
  EXPECT_GT(broken, 0u);
  (void)intact;
}

}  // namespace
}  // namespace swarmkv
