// SwarmKV's logging facade. All library output goes through here (to stderr
// by default, never to stdout); llama.cpp's own log is routed into it too.
//
// Thread-safe: every function here may be called from any thread.
#pragma once

#include <functional>
#include <string_view>

#include <fmt/format.h>

namespace swarmkv {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

// Parses "debug", "info", "warn", "error" or "off". Throws Error
// (kInvalidArgument) naming the accepted values otherwise.
LogLevel parse_log_level(std::string_view name);
std::string_view to_string(LogLevel level) noexcept;

// Messages below `level` are dropped. Default: kWarn, or $SWARMKV_LOG_LEVEL
// when it is set to a valid name at first use.
void set_log_level(LogLevel level);
LogLevel log_level();

// Receives every message at or above the current level. An empty function
// restores the default sink (stderr, via spdlog). The sink may be called
// from any thread, one call at a time.
using LogSink = std::function<void(LogLevel, std::string_view)>;
void set_log_sink(LogSink sink);

// Emits one message (no trailing newline needed).
void log_message(LogLevel level, std::string_view message);

// fmt-style helpers; the format string is checked at compile time.
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kDebug)
    log_message(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kInfo)
    log_message(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kWarn)
    log_message(LogLevel::kWarn, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
void log_error(fmt::format_string<Args...> f, Args&&... args) {
  if (log_level() <= LogLevel::kError)
    log_message(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace swarmkv
