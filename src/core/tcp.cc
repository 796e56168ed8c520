// Plain POSIX TCP side channels (tcp.h).
#include "core/tcp.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "dtrain/core/error.h"

namespace dtrain::tcp {

Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

void set_timeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{.tv_sec = static_cast<time_t>(timeout.count() / 1000),
             .tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

size_t read_some(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

bool read_all(int fd, void* data, size_t n) { return read_some(fd, data, n) == n; }

bool write_u64(int fd, uint64_t v) { return write_all(fd, &v, sizeof v); }
bool read_u64(int fd, uint64_t& v) { return read_all(fd, &v, sizeof v); }

bool write_frame(int fd, std::string_view s) {
  return write_u64(fd, s.size()) && write_all(fd, s.data(), s.size());
}

bool read_frame(int fd, std::string& s, uint64_t max) {
  uint64_t n = 0;
  if (!read_u64(fd, n) || n > max) return false;
  s.resize(n);
  return read_all(fd, s.data(), n);
}

int connect_to(const std::string& address, std::string_view what, std::string_view peer,
               std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    throw InvalidArgumentError(str_cat(what, ": bad address '", address, "' of ", peer));
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    throw UnavailableError(str_cat(what, ": cannot resolve ", peer));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    const int err = errno;
    ::freeaddrinfo(res);
    throw UnavailableError(str_cat(what, ": no socket for ", peer, ": ", std::strerror(err)));
  }
  set_timeouts(fd, timeout);
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  const int err = errno;
  ::freeaddrinfo(res);
  if (rc != 0) {
    ::close(fd);
    throw UnavailableError(str_cat(what, ": cannot connect to ", peer, ": ", std::strerror(err)));
  }
  return fd;
}

Server::Server(const std::string& host, std::string what, std::chrono::milliseconds timeout,
               Handler handle)
    : what_(std::move(what)), timeout_(timeout), handle_(std::move(handle)) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (!host.empty() && ::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1) {
    throw InvalidArgumentError(str_cat(what_, ": bad listen address '", host, "'"));
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (listen_fd_ >= 0) ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throw UnavailableError(
        str_cat(what_, ": cannot listen on ", host.empty() ? "*" : host, ": ", std::strerror(err)));
  }
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  if (::pipe2(wake_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw UnavailableError(str_cat(what_, ": pipe failed: ", std::strerror(errno)));
  }
  thread_ = std::thread([this] { serve(); });
}

Server::~Server() {
  const char c = 0;
  [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void Server::serve() {
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
    set_timeouts(fd, timeout_);
    try {
      handle_(fd);
    } catch (const std::exception& e) {
      std::cerr << what_ << ": a request failed: " << e.what() << std::endl;
    }
  }
}

std::string local_address_towards(const std::string& host, bool ipv4_only) {
  addrinfo hints{};
  hints.ai_family = ipv4_only ? AF_INET : AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), "9", &hints, &found) != 0) return "";
  std::string out;
  for (const addrinfo* a = found; a != nullptr && out.empty(); a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof(local);
    char text[INET6_ADDRSTRLEN] = {};
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, addr, text, sizeof(text)) != nullptr) out = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return out;
}

std::string reachable_host(const std::string& service) {
  if (const char* host = std::getenv("DTRAIN_HOST"); host && *host) return host;
  const size_t colon = service.rfind(':');
  const std::string host = colon == std::string::npos ? service : service.substr(0, colon);
  if (host.empty() || host == "localhost" || host.rfind("127.", 0) == 0) return "127.0.0.1";
  std::string local = local_address_towards(host, /*ipv4_only=*/true);
  return local.empty() ? "127.0.0.1" : local;
}

}  // namespace dtrain::tcp
