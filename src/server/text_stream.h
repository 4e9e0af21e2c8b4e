// An answer's text sent in pieces as it grows, never taking a byte back.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace swarmkv::server {

// Holds back the last (longest stop string - 1) bytes, which a stop string
// completed by a later token would cut off, and a UTF-8 character split
// over tokens until its last byte is there. Thread-compatible.
class TextStream {
 public:
  TextStream() = default;  // no stop strings
  explicit TextStream(const std::vector<std::string>& stop);

  // The bytes of `text` (the answer so far, as GenerationTracker::text()
  // has it) that may go out now and have not gone out yet; `done`: the
  // answer is complete, everything not sent yet.
  std::string next(std::string_view text, bool done);

 private:
  size_t hold_ = 0;
  size_t sent_ = 0;
};

// How many bytes of `text` from the start end on a whole UTF-8 character,
// looking back at most 3 bytes from `end`.
size_t whole_characters(std::string_view text, size_t end);

}  // namespace swarmkv::server
