// The three string helpers of llama.cpp's common.cpp that its JSON-schema
// converter calls (declared in common.h). common.cpp itself is not compiled
// into our build: it brings the rest of `common` with it (argument parsing,
// logging, downloads, the sampler wrapper), none of which we use.
#include <string>
#include <vector>

#include "common.h"

std::string string_join(const std::vector<std::string>& values, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += separator;
    out += values[i];
  }
  return out;
}

std::vector<std::string> string_split(const std::string& str, const std::string& delimiter) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t end = str.find(delimiter); end != std::string::npos;
       end = str.find(delimiter, start)) {
    parts.push_back(str.substr(start, end - start));
    start = end + delimiter.size();
  }
  parts.push_back(str.substr(start));
  return parts;
}

std::string string_repeat(const std::string& str, size_t n) {
  std::string out;
  out.reserve(str.size() * n);
  for (size_t i = 0; i < n; ++i) out += str;
  return out;
}
