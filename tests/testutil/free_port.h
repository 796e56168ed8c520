// free_port(): a TCP port on 127.0.0.1 for tests that start servers on fixed ports, reserved for
// this test process. Two things could otherwise take it between the check and the test's bind:
// another test binary running beside this one (ctest -j) that was handed the same port, and any
// process's outgoing connection, whose local port the kernel takes from the ephemeral range. So
// the port is picked outside the ephemeral range (net.ipv4.ip_local_port_range), and reserved
// across processes by an exclusive flock on `<tmp>/dtrain-test-ports/<port>`, held until this
// process exits (its children inherit nothing: the descriptor is close-on-exec). Thread-safe.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>

namespace dtrain::testutil {

namespace free_port_detail {

// Whether a listening socket can be bound to 127.0.0.1:`port` right now.
inline bool can_bind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("free_port: socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as the servers do
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

// The ports outside the ephemeral range to pick from: [low, high).
inline std::pair<int, int> candidate_range() {
  int first = 32768, last = 60999;  // Linux's default ephemeral range
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> first >> last;
  if (first > 12000) return {10000, first};  // below it (the usual case)
  if (last < 63000) return {last + 1, 65536};
  throw std::runtime_error("free_port: the ephemeral port range " + std::to_string(first) + "-" +
                           std::to_string(last) + " leaves no port outside it");
}

}  // namespace free_port_detail

// Returns a port that no other test process holds, outside the ephemeral range, that could be
// bound a moment ago. Throws std::runtime_error (a test error, not a crash) when none is found.
inline int free_port() {
  static std::mutex mu;
  static std::set<int> mine;  // reserved by this process (each is returned once)
  std::lock_guard<std::mutex> lock(mu);
  const auto [low, high] = free_port_detail::candidate_range();
  const std::string dir = (std::filesystem::temp_directory_path() / "dtrain-test-ports").string();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  ::chmod(dir.c_str(), 01777);  // shared by every user's tests, like /tmp
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(low, high - 1);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = pick(rng);
    if (mine.count(port) != 0) continue;
    const std::string path = dir + "/" + std::to_string(port);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) continue;
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {  // another test process holds it
      ::close(fd);
      continue;
    }
    if (!free_port_detail::can_bind(port)) {  // something outside the tests listens there
      ::close(fd);
      continue;
    }
    mine.insert(port);  // `fd` stays open, and the lock held, until this process exits
    return port;
  }
  throw std::runtime_error("free_port: no free port in " + std::to_string(low) + "-" +
                           std::to_string(high - 1) + " after 1000 tries");
}

}  // namespace dtrain::testutil
