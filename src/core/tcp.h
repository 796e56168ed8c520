// Plain POSIX TCP for the small side channels between dtrain processes: the launchers' snapshot
// agents (src/fault/snapshot_wire.*) and the workers' backup copies (src/train/backup_transfer.*).
// Blocking sockets with per-call timeouts, length-prefixed frames (u64 little-endian length, then
// the bytes), a one-connection-at-a-time server thread, and the rule for the address other hosts
// reach this one at. Private to src/.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace dtrain::tcp {

// Owns a file descriptor; closes it when destroyed.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Read and write timeouts of `timeout` on `fd`, and TCP_NODELAY.
void set_timeouts(int fd, std::chrono::milliseconds timeout);

// False on EOF or an error (a timeout included).
bool write_all(int fd, const void* data, size_t n);
// Bytes read before EOF or an error (n when complete).
size_t read_some(int fd, void* data, size_t n);
bool read_all(int fd, void* data, size_t n);

bool write_u64(int fd, uint64_t v);
bool read_u64(int fd, uint64_t& v);
// A frame: u64 length + bytes. read_frame refuses (false) a length above `max`.
bool write_frame(int fd, std::string_view s);
bool read_frame(int fd, std::string& s, uint64_t max);

// Connects to "host:port" (IPv4) with `timeout` for the connect and every later read and write.
// `what` starts the errors ("snapshots", "backup transfer") and `peer` names the other side in
// them ("agent 127.0.0.1:4000", "node 1 at 10.0.0.2:4000"). Throws InvalidArgumentError for an
// address without a port and UnavailableError when it cannot resolve or connect.
int connect_to(const std::string& address, std::string_view what, std::string_view peer,
               std::chrono::milliseconds timeout);

// Listens on `host`:0 (all interfaces when empty; the kernel picks the port) and calls `handle`
// for each accepted connection, one at a time, on a thread of its own, with `timeout` on the
// connection's reads and writes (a peer that stops mid-request is dropped). An exception out of
// `handle` is printed to stderr prefixed by `what` and the server goes on. Throws
// InvalidArgumentError for a bad `host` and UnavailableError when it cannot listen.
class Server {
 public:
  using Handler = std::function<void(int fd)>;
  Server(const std::string& host, std::string what, std::chrono::milliseconds timeout,
         Handler handle);
  ~Server();  // stops serving (a request in progress is cut off)
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  int port() const { return port_; }

 private:
  void serve();

  std::string what_;
  std::chrono::milliseconds timeout_;
  Handler handle_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
};

// The local address that routes to `host` (a name or an address; a UDP connect, nothing is
// sent), or "" when `host` does not resolve or is unreachable. IPv4 only when `ipv4_only`.
std::string local_address_towards(const std::string& host, bool ipv4_only = false);

// The address other hosts reach this one at, given the coordination service's host (a "host" or
// "host:port"): DTRAIN_HOST when set, 127.0.0.1 for a service on loopback (or none), else the
// local IPv4 address that routes to the service's host (127.0.0.1 when there is none).
std::string reachable_host(const std::string& service);

}  // namespace dtrain::tcp
