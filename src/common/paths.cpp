#include "swarmkv/paths.h"

#include <fcntl.h>
#include <unistd.h>

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

namespace {

// `given` as a path when it names one (or holds a '/'), else the file of
// that name in <cache_dir()>/models/.
std::string find_model(const std::string& given, std::string_view origin) {
  const std::string what = fmt::format("model file (from {})", origin);
  std::error_code ec;
  if (given.find('/') != std::string::npos || std::filesystem::exists(given, ec)) {
    require_regular_file(given, what);
    return given;
  }
  const std::string cached = fmt::format("{}/models/{}", cache_dir(), given);
  if (!std::filesystem::exists(cached, ec)) {
    throw Error(ErrorCode::kNotFound,
                fmt::format("{} '{}' does not exist: looked for '{}' in the current directory "
                            "and in the model cache ('{}')",
                            what, given, given, cached));
  }
  require_regular_file(cached, what);
  return cached;
}

}  // namespace

std::string resolve_model_path(std::string_view explicit_path) {
  if (!explicit_path.empty()) return find_model(std::string(explicit_path), "--model");
  if (std::string env = env_or_empty("SWARMKV_MODEL"); !env.empty())
    return find_model(env, "$SWARMKV_MODEL");
  std::error_code ec;
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

void write_text_file_atomically(const std::string& path, std::string_view text) {
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const auto fail = [&](const char* step) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(ErrorCode::kIo, fmt::format("cannot write '{}' ({}): {}", path, step,
                                            err != 0 ? std::strerror(err) : "failed"));
  };
  errno = 0;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("open");
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    ::close(fd);
    fail("fsync");
  }
  if (::close(fd) != 0) fail("close");
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename");
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
