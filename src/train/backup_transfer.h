// Copies one committed backup (a checkpoint prefix's files: "<name>.index" and its data shards)
// from a peer worker's backup directory into a directory of this host, over one TCP connection
// (docs/fault-tolerance.md, "No shared filesystem"). Wire format, every integer little-endian:
//   request:  u64 length + "get", u64 length + NAME (a plain file-name prefix, "backup-7")
//   reply:    u64 N (0: the peer holds no such backup), then N times:
//             u64 length + SUFFIX (".index", ".data-00000-of-00001"), u64 SIZE, SIZE bytes,
//             u32 CRC32C of those bytes
// The receiver writes each file under a temporary name, checks its size and CRC-32C, and renames
// the files into place (data first, the index last) only once every byte of every file arrived
// intact, so a copy is either complete or absent. Private to src/train.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace dtrain::tcp {
class Server;
}  // namespace dtrain::tcp

namespace dtrain::train {

class BackupFileServer {
 public:
  // Serves the backups of `dir` on all interfaces, port chosen by the kernel, on a thread of its
  // own (one connection at a time). Throws UnavailableError when it cannot listen.
  explicit BackupFileServer(std::string dir);
  ~BackupFileServer();  // stops serving (a transfer in progress is cut off)
  BackupFileServer(const BackupFileServer&) = delete;
  BackupFileServer& operator=(const BackupFileServer&) = delete;
  int port() const;

 private:
  void handle(int fd);

  std::string dir_;
  std::unique_ptr<tcp::Server> server_;  // last: its thread calls handle()
};

struct FetchedBackup {
  std::string prefix;  // "<into>/<name>"
  int files = 0;
  uint64_t bytes = 0;
};

// Fetches backup `name` from the server at `address` ("host:port", called `peer` in errors) into
// directory `into` (created if needed). Waits at most `timeout` for each read or write. Throws
// UnavailableError naming the peer when it cannot be reached or the connection ends early (with
// the file and the bytes received), NotFoundError when the peer holds no such backup,
// DataLossError when a file's size or CRC-32C does not match, and what AtomicFile throws
// (ResourceExhaustedError on a full disk, naming the file). Nothing is left in `into` unless the
// whole backup arrived.
FetchedBackup fetch_backup(const std::string& address, const std::string& peer,
                           const std::string& name, const std::string& into,
                           std::chrono::milliseconds timeout = std::chrono::seconds(30));

// The address of this machine that other hosts reach it at, given the coordination service's
// host: DTRAIN_HOST when set, 127.0.0.1 for a service on loopback, else the local address that
// routes to the service's host (the rule of the launcher's snapshot agents).
std::string reachable_host(const std::string& service_host);

}  // namespace dtrain::train
