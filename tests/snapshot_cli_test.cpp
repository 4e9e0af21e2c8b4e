// `swarmkv snapshot` on hostile files, in-process through cli::run: what a
// file given on the command line can make the command do (remove a file
// that is not a snapshot, write terminal escapes from its metadata).
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "cli.h"
#include "swarmkv/snapshot.h"

namespace swarmkv {
namespace {

namespace fs = std::filesystem;

struct Ran {
  int status = 0;
  std::string out;
  std::string err;
};

Ran swarmkv(std::vector<std::string> args) {
  args.insert(args.begin(), "swarmkv");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::ostringstream out, err;
  std::streambuf* const cout = std::cout.rdbuf(out.rdbuf());
  std::streambuf* const cerr = std::cerr.rdbuf(err.rdbuf());
  Ran r;
  r.status = cli::run(static_cast<int>(args.size()), argv.data());
  std::cout.rdbuf(cout);
  std::cerr.rdbuf(cerr);
  r.out = out.str();
  r.err = err.str();
  return r;
}

SnapshotMeta meta_with(const std::string& model_file, const std::string& producer) {
  SnapshotMeta m;
  m.binding.engine = "engine";
  m.binding.model_sha256 = std::string(64, 'a');
  m.binding.layout = {"llama", 30, 192, 192, "f16", "f16", false, false, 0, 512};
  m.tokens = {1, 2, 3};
  m.model_file = model_file;
  m.producer = producer;
  return m;
}

class SnapshotCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           fmt::format("swarmkv-snapshot-cli-test-{}-{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "store");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string store() const { return path("store"); }

  fs::path dir_;
};

// `info` and `verify` refuse a file without the magic; `rm` removed it.
TEST_F(SnapshotCliTest, RmRefusesAFileThatIsNotASnapshotAndRemovesNothing) {
  std::ofstream(path("victim.txt")) << "my notes\n";
  const std::vector<uint8_t> payload(100, 7);
  write_snapshot(path("real.swkv"), meta_with("m.gguf", "p"), payload);
  const Ran r =
      swarmkv({"snapshot", "--cache-dir", store(), "rm", path("real.swkv"), path("victim.txt")});
  EXPECT_EQ(r.status, cli::kExitFailed) << r.out << r.err;
  EXPECT_NE(r.err.find(fmt::format("corruption: snapshot '{}': not a SwarmKV snapshot (no "
                                   "SWKVSNAP magic); nothing removed",
                                   path("victim.txt"))),
            std::string::npos)
      << r.err;
  EXPECT_TRUE(fs::exists(path("victim.txt")));
  EXPECT_TRUE(fs::exists(path("real.swkv")));  // checked before any was removed

  // A snapshot file, damaged after its magic, is still removed by path.
  std::fstream(path("real.swkv"), std::ios::in | std::ios::out | std::ios::binary)
      .seekp(20)
      .write("XXXX", 4);
  const Ran ok = swarmkv({"snapshot", "--cache-dir", store(), "rm", path("real.swkv")});
  EXPECT_EQ(ok.status, cli::kExitOk) << ok.err;
  EXPECT_EQ(ok.out, fmt::format("removed {}\n", path("real.swkv")));
  EXPECT_FALSE(fs::exists(path("real.swkv")));

  // A store entry truncated to nothing is removed by its key.
  SnapshotStore s(store());
  const std::string entry = s.publish(meta_with("m.gguf", "p"), payload);
  fs::resize_file(entry, 0);
  const std::string key = fs::path(entry).stem().string();
  const Ran by_key = swarmkv({"snapshot", "--cache-dir", store(), "rm", key});
  EXPECT_EQ(by_key.status, cli::kExitOk) << by_key.err;
  EXPECT_FALSE(fs::exists(entry));
}

// A snapshot's metadata strings reach the terminal through `info`: control
// characters are shown escaped, never written raw.
TEST_F(SnapshotCliTest, InfoShowsControlCharactersInTheMetadataEscaped) {
  write_snapshot(path("evil.swkv"),
                 meta_with("m\x1b]0;owned\x07.gguf",
                           "swarmkv\x1b[2J\r\xc2\x9b"
                           "31m"),
                 std::vector<uint8_t>(100, 7));
  const Ran r = swarmkv({"snapshot", "info", path("evil.swkv")});
  ASSERT_EQ(r.status, cli::kExitOk) << r.err;
  for (const char c : r.out) {
    EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << static_cast<int>(c);
  }
  EXPECT_EQ(r.out.find("\xc2\x9b"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model m\\x1b]0;owned\\x07.gguf (sha256"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("by swarmkv\\x1b[2J\\x0d\\u009b31m\n"), std::string::npos) << r.out;
  // --json carries the strings as they are, JSON-escaped.
  const Ran j = swarmkv({"snapshot", "info", "--json", path("evil.swkv")});
  EXPECT_NE(j.out.find(R"("model_file": "m\u001b]0;owned\u0007.gguf")"), std::string::npos)
      << j.out;
}

}  // namespace
}  // namespace swarmkv
