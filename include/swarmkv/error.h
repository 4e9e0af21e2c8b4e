// SwarmKV's one error vocabulary.
//
// Convention for the whole public API: failures are reported by throwing
// swarmkv::Error (derived from std::runtime_error). Every message names the
// numbers a user needs to act on it. Functions document in their header
// comment what state is left behind when they throw.
//
// An Error is thrown and caught on one thread. What crosses a thread, and what
// a result keeps, is an ErrorValue: the code and a message its holder owns.
// Never hand an exception object (or an exception_ptr, or what() of one) to
// another thread: libstdc++ reference-counts both the exception and
// runtime_error's message in code ThreadSanitizer cannot see, so a correct
// hand-off still reports as a race (see NOTES.md, "Errors cross threads as
// values").
#pragma once

#include <iosfwd>
#include <stdexcept>
#include <string>
#include <string_view>

namespace swarmkv {

// Stable error categories; to_string() gives the stable name.
enum class ErrorCode {
  kInvalidArgument,   // bad option or input value
  kNotFound,          // a file or named entity does not exist
  kIo,                // reading or writing a file or a connection failed
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
  kCorruption,        // a stored snapshot is truncated or fails its checksum
  kIncompatible,      // a snapshot was made for another model, engine, layout or document
  kGraph,             // pipeline graph: cycle, unknown dependency, duplicate name
  kDependencyFailed,  // a node did not run because a node it depends on failed
  kUnauthenticated,   // a cluster message unsigned, or signed with another cluster key
  kInternal,          // a broken invariant inside SwarmKV
};

// Returns the stable name of `code`, e.g. "no_kv_slot".
std::string_view to_string(ErrorCode code) noexcept;

// An error as a value: what crosses threads and what results keep. Copies
// are deep (the message is a plain std::string). Thread-compatible.
struct ErrorValue {
  ErrorCode code = ErrorCode::kInternal;
  std::string message;  // without the "<code name>: " prefix

  // "<code name>: <message>", the same text as Error::what().
  std::string to_string() const;
  bool operator==(const ErrorValue&) const = default;
};
std::ostream& operator<<(std::ostream& out, const ErrorValue& error);  // to_string()

// Inside a catch block only: the exception being handled, as a value. An
// Error keeps its code and message; any other std::exception becomes
// kInternal with its what(); anything else kInternal "unknown exception".
ErrorValue current_error_value();

// The exception thrown by every SwarmKV API. what() is
// "<code name>: <message>". Thread-compatible (immutable after construction).
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  // An Error made from a value received from another thread, to throw here.
  explicit Error(const ErrorValue& value) : Error(value.code, value.message) {}

  // A deep copy of the code and message, to hand to another thread.
  ErrorValue value() const { return {code_, message_}; }

  ErrorCode code() const noexcept { return code_; }
  // The message without the "<code name>: " prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  ErrorCode code_;
  std::string message_;
};

}  // namespace swarmkv
