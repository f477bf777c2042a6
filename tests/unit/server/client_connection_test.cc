// ClientConnection on a real loopback connection: the socket is found from the endpoints httplib puts in
// the request, a pipelined request does not read as a disconnect, a closed client does.
#include "server/client_connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace hlm {
namespace {

sockaddr_in loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  return a;
}

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  auto* sa = reinterpret_cast<sockaddr*>(&a);
  EXPECT_EQ(peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len), 0);
  return ntohs(a.sin_port);
}

// A connected pair: the client's socket and the server's accepted one.
class Connection : public ::testing::Test {
 protected:
  Connection() {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = loopback(0);
    EXPECT_EQ(bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(listen(listener_, 1), 0);
    client_ = socket(AF_INET, SOCK_STREAM, 0);
    a = loopback(port_of(listener_, false));
    EXPECT_EQ(connect(client_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    server_ = accept(listener_, nullptr, nullptr);
    // What httplib's process_request fills in.
    req_.local_addr = "127.0.0.1";
    req_.local_port = port_of(server_, false);
    req_.remote_addr = "127.0.0.1";
    req_.remote_port = port_of(server_, true);
  }
  ~Connection() override {
    for (int fd : {listener_, client_, server_})
      if (fd >= 0) close(fd);
  }

  // closed() once the client's FIN has arrived (immediate on loopback, but not synchronous).
  static bool becomes_closed(const ClientConnection& c) {
    for (int i = 0; i < 100 && !c.closed(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return c.closed();
  }

  int listener_ = -1, client_ = -1, server_ = -1;
  httplib::Request req_;
};

TEST_F(Connection, FindsTheSocketAndNoticesTheClientLeaving) {
  const ClientConnection c(req_);
  ASSERT_TRUE(c.found());
  EXPECT_FALSE(c.closed());
  // The client's next request, sent ahead: data to read is not a disconnect.
  ASSERT_EQ(send(client_, "GET / HTTP/1.1\r\n", 16, 0), 16);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(c.closed());
  char buf[16];
  ASSERT_EQ(recv(server_, buf, sizeof(buf), 0), 16);
  close(client_);
  client_ = -1;
  EXPECT_TRUE(becomes_closed(c));
}

TEST_F(Connection, AnotherConnectionIsNotMistakenForIt) {
  req_.remote_port += 1;
  const ClientConnection c(req_);
  EXPECT_FALSE(c.found());
  close(client_);
  client_ = -1;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(c.closed());
}

}  // namespace
}  // namespace hlm
