// What a host name or address in a URL or a --host flag stands for.
#pragma once

#include <string>

namespace swarmkv {

// Whether `host` is this machine: an address in 127.0.0.0/8, ::1 (any
// spelling), or the name "localhost". Any other name is taken as another
// machine (nothing is looked up); so are 0.0.0.0 and ::, which listen on
// every interface.
bool is_loopback_host(const std::string& host);

}  // namespace swarmkv
