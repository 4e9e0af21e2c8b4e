#include "swarmkv/paths.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
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
    require_regular_file(std::string(explicit_path), "model file (from --model)");
    return std::string(explicit_path);
  }
  if (std::string env = env_or_empty("SWARMKV_MODEL"); !env.empty()) {
    require_regular_file(env, "model file (from $SWARMKV_MODEL)");
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

void require_regular_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) {
    throw Error(ErrorCode::kNotFound, fmt::format("{} '{}' does not exist", what, path));
  }
  if (std::filesystem::is_directory(status)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} '{}' is a directory, not a file", what, path));
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} '{}' is not a regular file", what, path));
  }
}

void require_text(std::string_view text, std::string_view what) {
  if (const size_t at = text.find('\0'); at != std::string_view::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("{} contains a NUL byte at offset {} (a binary file?)", what, at));
  }
}

void write_text_file(const std::string& path, std::string_view text) {
  errno = 0;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (out) out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (out) out.flush();
  if (!out) {
    throw Error(ErrorCode::kIo, fmt::format("cannot write '{}': {}", path,
                                            errno != 0 ? std::strerror(errno) : "write failed"));
  }
}

std::string read_file(const std::string& path, std::string_view what) {
  require_regular_file(path, what);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, fmt::format("cannot open '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::kIo, fmt::format("reading '{}' failed", path));
  return ss.str();
}

}  // namespace swarmkv
