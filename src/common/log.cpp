#include "swarmkv/log.h"

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "swarmkv/error.h"

namespace swarmkv {
namespace {

LogLevel initial_level() {
  if (const char* env = std::getenv("SWARMKV_LOG_LEVEL"); env != nullptr && *env != '\0') {
    try {
      return parse_log_level(env);
    } catch (const Error&) {
      // An unusable value must not make the library unusable; the default applies.
    }
  }
  return LogLevel::kWarn;
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

struct SinkState {
  std::mutex mutex;
  LogSink custom;
  std::shared_ptr<spdlog::logger> stderr_logger;
};

SinkState& sink_state() {
  static SinkState state;
  return state;
}

spdlog::level::level_enum to_spdlog(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return spdlog::level::debug;
    case LogLevel::kInfo:
      return spdlog::level::info;
    case LogLevel::kWarn:
      return spdlog::level::warn;
    case LogLevel::kError:
      return spdlog::level::err;
    case LogLevel::kOff:
      return spdlog::level::off;
  }
  return spdlog::level::off;
}

}  // namespace

LogLevel parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::kDebug;
  if (name == "info") return LogLevel::kInfo;
  if (name == "warn" || name == "warning") return LogLevel::kWarn;
  if (name == "error") return LogLevel::kError;
  if (name == "off") return LogLevel::kOff;
  throw Error(ErrorCode::kInvalidArgument, "unknown log level '" + std::string(name) +
                                               "' (expected debug, info, warn, error or off)");
}

std::string_view to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::kDebug:
      return "debug";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarn:
      return "warn";
    case LogLevel::kError:
      return "error";
    case LogLevel::kOff:
      return "off";
  }
  return "off";
}

void set_log_level(LogLevel level) {
  level_ref().store(level, std::memory_order_relaxed);
}

LogLevel log_level() {
  return level_ref().load(std::memory_order_relaxed);
}

void set_log_sink(LogSink sink) {
  SinkState& state = sink_state();
  std::lock_guard lock(state.mutex);
  state.custom = std::move(sink);
}

void log_message(LogLevel level, std::string_view message) {
  if (level == LogLevel::kOff || level < log_level()) return;
  // Callers often pass text that already ends in a newline (llama.cpp does).
  while (!message.empty() && (message.back() == '\n' || message.back() == '\r')) {
    message.remove_suffix(1);
  }
  SinkState& state = sink_state();
  std::lock_guard lock(state.mutex);
  if (state.custom) {
    state.custom(level, message);
    return;
  }
  if (!state.stderr_logger) {
    // Not registered globally: embedding applications keep their own spdlog setup.
    state.stderr_logger = std::make_shared<spdlog::logger>(
        "swarmkv", std::make_shared<spdlog::sinks::stderr_color_sink_st>());
    state.stderr_logger->set_pattern("[%H:%M:%S.%e] [swarmkv] [%^%l%$] %v");
    state.stderr_logger->set_level(spdlog::level::trace);
  }
  state.stderr_logger->log(to_spdlog(level), "{}", message);
}

}  // namespace swarmkv
