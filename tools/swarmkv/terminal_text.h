// Text from a pipeline (agent names, answers, errors that quote them) on its
// way to a terminal: control characters are shown escaped, so that an answer
// or a name cannot set the window title, clear the screen or move the cursor.
// Output to a pipe or a file is left as it is: programs read it.
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <unistd.h>

namespace swarmkv::cli {

// `s` with every C0 control byte (but newline and tab where `keep_lines`),
// DEL, and every C1 control (U+0080..U+009F, UTF-8 C2 80..C2 9F) written as
// \xNN (C1: \u00NN). Without `keep_lines`: one-line fields (a table's cells).
inline std::string terminal_safe(std::string_view s, bool keep_lines = true) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    const auto next = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
    if ((c < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else if (c == 0xc2 && next >= 0x80 && next <= 0x9f) {
      out += fmt::format("\\u{:04x}", next);
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// What to print of `s` on `stream`: terminal_safe(s) on a terminal, else s.
class TerminalText {
 public:
  explicit TerminalText(std::FILE* stream) : on_terminal_(::isatty(::fileno(stream)) == 1) {}
  std::string operator()(std::string_view s) const {
    return on_terminal_ ? terminal_safe(s) : std::string(s);
  }

 private:
  bool on_terminal_;
};

}  // namespace swarmkv::cli
