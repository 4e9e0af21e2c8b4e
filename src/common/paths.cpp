#include "swarmkv/paths.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "swarmkv/error.h"

namespace swarmkv {
namespace {

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::string(value) : std::string();
}

}  // namespace

std::string cache_dir() {
  if (std::string dir = env_or_empty("SWARMKV_CACHE"); !dir.empty()) return dir;
  if (std::string xdg = env_or_empty("XDG_CACHE_HOME"); !xdg.empty()) return xdg + "/swarmkv";
  return env_or_empty("HOME") + "/.cache/swarmkv";
}

std::string resolve_model_path(std::string_view explicit_path) {
  std::error_code ec;
  if (!explicit_path.empty()) {
    if (!std::filesystem::is_regular_file(explicit_path, ec)) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("model file '{}' (from --model) does not exist", explicit_path));
    }
    return std::string(explicit_path);
  }
  if (std::string env = env_or_empty("SWARMKV_MODEL"); !env.empty()) {
    if (!std::filesystem::is_regular_file(env, ec)) {
      throw Error(ErrorCode::kNotFound,
                  fmt::format("model file '{}' (from $SWARMKV_MODEL) does not exist", env));
    }
    return env;
  }
  std::string fallback = fmt::format("{}/models/{}", cache_dir(), kDefaultModelFile);
  if (!std::filesystem::is_regular_file(fallback, ec)) {
    throw Error(
        ErrorCode::kNotFound,
        fmt::format(
            "no model: pass --model PATH, set SWARMKV_MODEL, or fetch the default model into "
            "'{}' with scripts/fetch-model.sh",
            fallback));
  }
  return fallback;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, fmt::format("cannot open '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::kIo, fmt::format("reading '{}' failed", path));
  return ss.str();
}

}  // namespace swarmkv
