#include "swarmkv/error.h"

#include <exception>
#include <ostream>

namespace swarmkv {

std::string_view to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kIo:
      return "io";
    case ErrorCode::kModelLoad:
      return "model_load";
    case ErrorCode::kContextCreate:
      return "context_create";
    case ErrorCode::kBudget:
      return "budget";
    case ErrorCode::kNoKvSlot:
      return "no_kv_slot";
    case ErrorCode::kAborted:
      return "aborted";
    case ErrorCode::kInvalidBatch:
      return "invalid_batch";
    case ErrorCode::kDecodeFatal:
      return "decode_fatal";
    case ErrorCode::kTokenize:
      return "tokenize";
    case ErrorCode::kChatTemplate:
      return "chat_template";
    case ErrorCode::kState:
      return "state";
    case ErrorCode::kCorruption:
      return "corruption";
    case ErrorCode::kIncompatible:
      return "incompatible";
    case ErrorCode::kGraph:
      return "graph";
    case ErrorCode::kDependencyFailed:
      return "dependency_failed";
    case ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

std::string ErrorValue::to_string() const {
  return std::string(swarmkv::to_string(code)) + ": " + message;
}

std::ostream& operator<<(std::ostream& out, const ErrorValue& error) {
  return out << error.to_string();
}

ErrorValue current_error_value() {
  try {
    throw;
  } catch (const Error& e) {
    return e.value();
  } catch (const std::exception& e) {
    return {ErrorCode::kInternal, std::string(e.what())};
  } catch (...) {
    return {ErrorCode::kInternal, "unknown exception"};
  }
}

Error::Error(ErrorCode code, const std::string& message)
    : std::runtime_error(std::string(to_string(code)) + ": " + message),
      code_(code),
      message_(message) {}

}  // namespace swarmkv
