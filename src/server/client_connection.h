// ClientConnection: notices that the client of a request waiting for its answer went away. httplib 0.11
// (Debian's build) gives handlers neither the socket nor a disconnect signal, only the connection's two
// endpoints, which it reads into the request with getsockname / getpeername; the socket is found among
// the process's descriptors by those same two endpoints. It stays open (httplib closes it only after
// the handler returns), so the descriptor cannot be reused under us.
#pragma once

#include <httplib.h>

namespace hlm {

class ClientConnection {
 public:
  explicit ClientConnection(const httplib::Request& req);

  // Whether the socket was found (without it closed() is always false).
  bool found() const { return fd_ >= 0; }
  // The client closed or reset the connection: it is readable and has nothing to read, the test
  // httplib's own is_writable applies to a streaming response.
  bool closed() const;
  // Sends the end of this side's stream (a FIN after the bytes already written): how a body without a
  // length ends on a connection httplib would otherwise keep open.
  void shut_down_sending() const;

 private:
  int fd_ = -1;
};

}  // namespace hlm
