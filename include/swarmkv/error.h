// SwarmKV's one error vocabulary.
//
// Convention for the whole public API: failures are reported by throwing
// swarmkv::Error (derived from std::runtime_error). Every message names the
// numbers a user needs to act on it. Functions document in their header
// comment what state is left behind when they throw.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace swarmkv {

// Stable error categories; to_string() gives the stable name.
enum class ErrorCode {
  kInvalidArgument,   // bad option or input value
  kNotFound,          // a file or named entity does not exist
  kIo,                // reading or writing a file failed
  kModelLoad,         // llama.cpp could not load the model file
  kContextCreate,     // llama.cpp could not create a context
  kBudget,            // a token budget (n_ctx, n_batch) would be exceeded
  kNoKvSlot,          // llama_decode returned 1: no KV slot for the batch
  kAborted,           // llama_decode returned 2: aborted by the abort callback
  kInvalidBatch,      // llama_decode returned -1: the batch was rejected
  kDecodeFatal,       // llama_decode returned < -1: fatal engine error
  kTokenize,          // tokenisation or detokenisation failed
  kChatTemplate,      // the model has no usable chat template
  kState,             // exporting or restoring KV state failed
  kGraph,             // pipeline graph: cycle, unknown dependency, duplicate name
  kDependencyFailed,  // a node did not run because a node it depends on failed
  kInternal,          // a broken invariant inside SwarmKV
};

// Returns the stable name of `code`, e.g. "no_kv_slot".
std::string_view to_string(ErrorCode code) noexcept;

// The exception thrown by every SwarmKV API. what() is
// "<code name>: <message>". Thread-compatible (immutable after construction).
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);

  ErrorCode code() const noexcept { return code_; }
  // The message without the "<code name>: " prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

}  // namespace swarmkv
