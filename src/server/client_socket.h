// Whether the client of a request still waits for its answer. cpp-httplib
// 0.11 tells a handler nothing of its connection, and a handler that writes
// nothing until the answer is complete (a request that is not streamed)
// never sees a failed write. So the handler finds its accepted socket by
// the client's address and port and peeks at it: a client that closed or
// reset the connection has gone.
#pragma once

#include <string>

namespace swarmkv::server {

// Thread-compatible: one handler uses it, while httplib keeps the
// connection open (until the handler returns).
class ClientSocket {
 public:
  // Finds the process's socket whose peer is `remote_addr`:`remote_port`
  // (as httplib's Request gives them: numeric host) and whose own port is
  // `local_port`. None found (not Linux, no /proc): hung_up() is false.
  ClientSocket(const std::string& remote_addr, int remote_port, int local_port);

  // True once the client closed its end or reset the connection. A client
  // that half-closes its sending side and still reads counts as gone (HTTP
  // clients do not do that).
  bool hung_up() const;

 private:
  int fd_ = -1;
};

}  // namespace swarmkv::server
