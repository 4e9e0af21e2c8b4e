#include "server/text_stream.h"

#include <algorithm>

namespace swarmkv::server {

TextStream::TextStream(const std::vector<std::string>& stop) {
  size_t longest = 0;
  for (const std::string& s : stop) longest = std::max(longest, s.size());
  hold_ = longest > 0 ? longest - 1 : 0;
}

std::string TextStream::next(std::string_view text, bool done) {
  size_t end = done ? text.size() : (text.size() > hold_ ? text.size() - hold_ : 0);
  if (!done) end = whole_characters(text, end);
  if (end <= sent_) return {};
  std::string out(text.substr(sent_, end - sent_));
  sent_ = end;
  return out;
}

size_t whole_characters(std::string_view text, size_t end) {
  for (size_t back = 1; back <= 3 && back <= end; ++back) {
    const auto c = static_cast<unsigned char>(text[end - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    return back < len ? end - back : end;
  }
  return end;
}

}  // namespace swarmkv::server
