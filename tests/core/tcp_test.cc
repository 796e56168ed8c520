#include "core/tcp.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "dtrain/core/error.h"

namespace dtrain::tcp {
namespace {

using std::chrono::seconds;

// A server that answers every frame with the frame reversed, over real loopback sockets.
TEST(Tcp, FramesGoBothWaysThroughTheServer) {
  Server server("127.0.0.1", "echo", seconds(10), [](int fd) {
    std::string s;
    while (read_frame(fd, s, 1 << 20)) {
      std::string r(s.rbegin(), s.rend());
      if (!write_frame(fd, r)) return;
    }
  });
  ASSERT_GT(server.port(), 0);
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  for (int round = 0; round < 3; ++round) {  // one connection at a time, one after the other
    Fd conn(connect_to(address, "echo", "the echo server", seconds(10)));
    std::string reply;
    ASSERT_TRUE(write_frame(conn.fd, "abc"));
    ASSERT_TRUE(read_frame(conn.fd, reply, 16));
    EXPECT_EQ(reply, "cba");
    const std::string big(100000, 'x');
    ASSERT_TRUE(write_frame(conn.fd, big));
    ASSERT_TRUE(read_frame(conn.fd, reply, big.size()));
    EXPECT_EQ(reply, big);
  }
}

TEST(Tcp, AFrameLongerThanTheBoundIsRefused) {
  Server server("127.0.0.1", "echo", seconds(10), [](int fd) {
    std::string s;
    if (read_frame(fd, s, 1 << 20)) write_frame(fd, s);
  });
  Fd conn(connect_to("127.0.0.1:" + std::to_string(server.port()), "echo", "echo", seconds(10)));
  ASSERT_TRUE(write_frame(conn.fd, "0123456789"));
  std::string reply;
  EXPECT_FALSE(read_frame(conn.fd, reply, 9));
}

TEST(Tcp, AHandlerThatThrowsDoesNotStopTheServer) {
  int calls = 0;
  Server server("127.0.0.1", "flaky", seconds(10), [&calls](int fd) {
    if (++calls == 1) throw DataLossError("the first request is bad");
    write_frame(fd, "fine");
  });
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  {
    Fd conn(connect_to(address, "flaky", "flaky", seconds(10)));
    std::string reply;
    EXPECT_FALSE(read_frame(conn.fd, reply, 16));  // closed without an answer
  }
  Fd conn(connect_to(address, "flaky", "flaky", seconds(10)));
  std::string reply;
  ASSERT_TRUE(read_frame(conn.fd, reply, 16));
  EXPECT_EQ(reply, "fine");
}

TEST(Tcp, ConnectErrorsNameThePeer) {
  int port = 0;
  {
    Server gone("127.0.0.1", "gone", seconds(1), [](int) {});
    port = gone.port();
  }  // closed: nothing listens there now
  try {
    connect_to("127.0.0.1:" + std::to_string(port), "snapshots", "agent of node 3", seconds(2));
    FAIL() << "connected to a closed port";
  } catch (const UnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find("snapshots: cannot connect to agent of node 3"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(connect_to("127.0.0.1", "snapshots", "agent", seconds(1)), InvalidArgumentError);
  EXPECT_THROW(Server("not-an-address", "x", seconds(1), [](int) {}), InvalidArgumentError);
}

TEST(Tcp, ReachableHostFollowsTheService) {
  ::unsetenv("DTRAIN_HOST");
  EXPECT_EQ(reachable_host(""), "127.0.0.1");
  EXPECT_EQ(reachable_host("localhost:2379"), "127.0.0.1");
  EXPECT_EQ(reachable_host("127.0.0.5:80"), "127.0.0.1");
  // A remote service: the local address that routes to it (loopback routes to itself here).
  EXPECT_EQ(local_address_towards("127.0.0.1", /*ipv4_only=*/true), "127.0.0.1");
  EXPECT_EQ(local_address_towards("no-such-host.invalid"), "");
  ::setenv("DTRAIN_HOST", "10.1.2.3", 1);
  EXPECT_EQ(reachable_host("192.0.2.1:2379"), "10.1.2.3");
  ::unsetenv("DTRAIN_HOST");
}

}  // namespace
}  // namespace dtrain::tcp
