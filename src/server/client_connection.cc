#include "server/client_connection.h"

#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace hlm {

namespace {

// The address and port of one end of a socket, formatted as httplib formats them (numeric host).
bool endpoint(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  auto* sa = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return false;
  }
  std::array<char, NI_MAXHOST> host{};
  if (getnameinfo(sa, len, host.data(), host.size(), nullptr, 0, NI_NUMERICHOST) != 0) return false;
  ip = host.data();
  return true;
}

}  // namespace

ClientConnection::ClientConnection(const httplib::Request& req) {
  // Error codes rather than exceptions: not finding the socket only means not noticing a disconnect.
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    const int fd = std::atoi(it->path().filename().c_str());
    std::string ip;
    int port = -1;
    if (!endpoint(fd, false, ip, port) || port != req.local_port || ip != req.local_addr) continue;
    if (!endpoint(fd, true, ip, port) || port != req.remote_port || ip != req.remote_addr) continue;
    fd_ = fd;
    return;
  }
}

bool ClientConnection::closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) return true;
  // Readable: either the client's next request (pipelined) or the end of the stream.
  char byte = 0;
  const ssize_t n = recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void ClientConnection::shut_down_sending() const {
  if (fd_ >= 0) shutdown(fd_, SHUT_WR);
}

}  // namespace hlm
