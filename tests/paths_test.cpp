#include "swarmkv/paths.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "swarmkv/error.h"

namespace swarmkv {
namespace {

// Sets an environment variable for one test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_, old_.c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(PathsTest, CacheDirFollowsSwarmkvCacheThenXdgThenHome) {
  ScopedEnv home("HOME", "/home/u");
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  {
    ScopedEnv cache("SWARMKV_CACHE", nullptr);
    EXPECT_EQ(cache_dir(), "/home/u/.cache/swarmkv");
    ScopedEnv xdg2("XDG_CACHE_HOME", "/x");
    EXPECT_EQ(cache_dir(), "/x/swarmkv");
  }
  ScopedEnv cache("SWARMKV_CACHE", "/c");
  EXPECT_EQ(cache_dir(), "/c");
}

TEST(PathsTest, ExplicitPathWinsAndMustExist) {
  const auto dir = std::filesystem::temp_directory_path() / "swarmkv_paths_test";
  std::filesystem::create_directories(dir);
  const auto file = dir / "m.gguf";
  std::ofstream(file) << "x";
  ScopedEnv model("SWARMKV_MODEL", "/does/not/exist.gguf");
  EXPECT_EQ(resolve_model_path(file.string()), file.string());
  try {
    resolve_model_path((dir / "missing.gguf").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("--model"), std::string::npos);
  }
  std::filesystem::remove_all(dir);
}

// `--model NAME` (the README's worker command, the coordinator's "start a
// worker" hint) finds the file in the model cache from any directory; a
// name found nowhere names both places; a path is never looked up.
TEST(PathsTest, ABareModelNameIsLookedUpInTheModelCache) {
  const auto cache = std::filesystem::temp_directory_path() / "swarmkv_paths_cache";
  std::filesystem::create_directories(cache / "models");
  std::ofstream(cache / "models" / "m.gguf") << "x";
  ScopedEnv env("SWARMKV_CACHE", cache.c_str());
  EXPECT_EQ(resolve_model_path("m.gguf"), (cache / "models" / "m.gguf").string());
  {
    ScopedEnv model("SWARMKV_MODEL", "m.gguf");
    EXPECT_EQ(resolve_model_path(""), (cache / "models" / "m.gguf").string());
  }
  try {
    resolve_model_path("other.gguf");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.value(),
              (ErrorValue{ErrorCode::kNotFound,
                          "model file (from --model) 'other.gguf' does not exist: looked for "
                          "'other.gguf' in the current directory and in the model cache ('" +
                              (cache / "models" / "other.gguf").string() + "')"}));
  }
  try {
    resolve_model_path("./m.gguf");
    FAIL() << "a path was looked up in the cache";
  } catch (const Error& e) {
    EXPECT_EQ(e.value(), (ErrorValue{ErrorCode::kNotFound,
                                     "model file (from --model) './m.gguf' does not exist"}));
  }
  std::filesystem::remove_all(cache);
}

TEST(PathsTest, EnvironmentModelIsUsedAndCheckedWhenNoExplicitPath) {
  ScopedEnv model("SWARMKV_MODEL", "/does/not/exist.gguf");
  try {
    resolve_model_path("");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("$SWARMKV_MODEL"), std::string::npos);
  }
}

TEST(PathsTest, MissingDefaultModelSaysHowToFetchIt) {
  ScopedEnv model("SWARMKV_MODEL", nullptr);
  ScopedEnv cache("SWARMKV_CACHE", "/nonexistent-swarmkv-cache");
  try {
    resolve_model_path("");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch-model.sh"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("/nonexistent-swarmkv-cache/models/"), std::string::npos);
  }
}

TEST(PathsTest, ReadFileReturnsTheBytesOrNamesTheMissingFile) {
  const auto path = std::filesystem::temp_directory_path() / "swarmkv_read_file_test.txt";
  std::ofstream(path, std::ios::binary) << std::string("a\0b\n", 4);
  EXPECT_EQ(read_file(path.string()), std::string("a\0b\n", 4));
  std::filesystem::remove(path);
  try {
    read_file(path.string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos);
  }
}

}  // namespace
}  // namespace swarmkv
