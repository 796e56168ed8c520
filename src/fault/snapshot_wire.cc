// The launchers' snapshot transport (snapshot_wire.h): plain POSIX sockets.
#include "fault/snapshot_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtrain/core/error.h"
#include "fault/launch_util.h"
#include "fault/worker_process.h"

namespace dtrain::fault {
namespace {

constexpr uint64_t kMaxFrame = uint64_t{64} << 30;  // a sanity bound on one length prefix

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void set_timeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{.tv_sec = static_cast<time_t>(timeout.count() / 1000),
             .tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// False on EOF or error (a timeout included).
bool write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool read_all(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool write_frame(int fd, std::string_view s) {
  const uint64_t n = s.size();
  return write_all(fd, reinterpret_cast<const char*>(&n), sizeof n) &&
         write_all(fd, s.data(), s.size());
}

bool read_frame(int fd, std::string& s) {
  uint64_t n = 0;
  if (!read_all(fd, reinterpret_cast<char*>(&n), sizeof n) || n > kMaxFrame) return false;
  s.resize(n);
  return read_all(fd, s.data(), n);
}

bool write_files(int fd, const SnapshotFiles& files) {
  if (!write_frame(fd, std::to_string(files.size()))) return false;
  for (const auto& [name, bytes] : files) {
    if (!write_frame(fd, name) || !write_frame(fd, bytes)) return false;
  }
  return true;
}

bool read_files(int fd, SnapshotFiles& files) {
  std::string count;
  if (!read_frame(fd, count)) return false;
  const std::optional<int64_t> n = parse_int(count);
  if (!n || *n < 0 || *n > 1024) return false;
  files.resize(static_cast<size_t>(*n));
  for (auto& [name, bytes] : files) {
    if (!read_frame(fd, name) || !read_frame(fd, bytes)) return false;
  }
  return true;
}

int connect_to(const std::string& address, std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    throw InvalidArgumentError(str_cat("snapshots: bad agent address '", address, "'"));
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    throw UnavailableError(str_cat("snapshots: cannot resolve agent ", address));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  set_timeouts(fd, timeout);
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  const int err = errno;
  ::freeaddrinfo(res);
  if (rc != 0) {
    ::close(fd);
    throw UnavailableError(
        str_cat("snapshots: cannot connect to agent ", address, ": ", std::strerror(err)));
  }
  return fd;
}

}  // namespace

SnapshotServer::SnapshotServer(const std::string& host, Put put, Get get)
    : put_(std::move(put)), get_(std::move(get)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    throw InvalidArgumentError(str_cat("snapshots: bad listen address '", host, "'"));
  }
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    throw UnavailableError(str_cat("snapshots: cannot listen on ", host.empty() ? "*" : host, ": ",
                                   std::strerror(err)));
  }
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  if (::pipe2(wake_, O_CLOEXEC) != 0) throw UnavailableError("snapshots: pipe failed");
  thread_ = std::thread([this] { serve(); });
}

SnapshotServer::~SnapshotServer() {
  const char c = 0;
  [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void SnapshotServer::serve() {
  while (true) {
    pollfd fds[2] = {{.fd = listen_fd_, .events = POLLIN, .revents = 0},
                     {.fd = wake_[0], .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Fd conn(fd);
    set_timeouts(fd, std::chrono::seconds(10));  // a peer that stops mid-request is dropped
    try {
      handle(fd);
    } catch (const std::exception& e) {
      say("snapshots: a request failed: ", e.what());
    }
  }
}

void SnapshotServer::handle(int fd) {
  std::string op, key, step_text;
  if (!read_frame(fd, op) || !read_frame(fd, key) || !read_frame(fd, step_text)) return;
  const std::optional<int64_t> step = parse_int(step_text);
  if (!step) return;
  if (op == "put") {
    SnapshotFiles files;
    if (!read_files(fd, files)) return;  // incomplete: nothing is stored
    put_(key, *step, std::move(files));
    write_frame(fd, "ok");
  } else if (op == "get") {
    const std::optional<SnapshotFiles> files = get_(key, *step);
    write_files(fd, files.value_or(SnapshotFiles{}));
  }
}

void put_snapshot(const std::string& address, const std::string& key, int64_t step,
                  const SnapshotFiles& files, std::chrono::milliseconds timeout) {
  Fd conn(connect_to(address, timeout));
  std::string reply;
  if (!write_frame(conn.fd, "put") || !write_frame(conn.fd, key) ||
      !write_frame(conn.fd, std::to_string(step)) || !write_files(conn.fd, files) ||
      !read_frame(conn.fd, reply) || reply != "ok") {
    throw UnavailableError(
        str_cat("snapshots: could not send ", key, " step ", step, " to agent ", address));
  }
}

std::optional<SnapshotFiles> get_snapshot(const std::string& address, const std::string& key,
                                          int64_t step, std::chrono::milliseconds timeout) {
  Fd conn(connect_to(address, timeout));
  SnapshotFiles files;
  if (!write_frame(conn.fd, "get") || !write_frame(conn.fd, key) ||
      !write_frame(conn.fd, std::to_string(step)) || !read_files(conn.fd, files)) {
    throw UnavailableError(
        str_cat("snapshots: could not fetch ", key, " step ", step, " from agent ", address));
  }
  if (files.empty()) return std::nullopt;
  return files;
}

}  // namespace dtrain::fault
