// Bounded random-input tests of the two parsers a user feeds directly: the
// pipeline-file loader and the command line. Each mutates a seed corpus
// (tests/fuzz/) with byte edits and YAML/flag tokens, a fixed number of
// inputs from a fixed seed, and requires that every input either parses or
// fails with a swarmkv::Error: no other exception, crash, hang or sanitizer
// report. $SWARMKV_FUZZ_INPUTS overrides the count (default 10,000 each),
// $SWARMKV_FUZZ_SEED the seed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "cli.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"

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

}  // namespace
}  // namespace swarmkv
