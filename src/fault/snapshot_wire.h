// The launchers' snapshot transport: one TCP connection per request between `dtrain launch`
// agents (src/fault/snapshots.h), framed as length-prefixed strings:
//   put KEY STEP N (NAME BYTES)*N  → "ok"      a snapshot's files, held in the receiver's memory
//   get KEY STEP                   → N (NAME BYTES)*N, N = 0 when not held
// A snapshot is stored only once every byte of it has arrived, so a sender killed mid-push
// leaves nothing behind. Private to src/fault.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtrain::tcp {
class Server;
}  // namespace dtrain::tcp

namespace dtrain::fault {

// A snapshot's files: name suffix after the prefix (".index", ".data-00000-of-00001") → bytes.
using SnapshotFiles = std::vector<std::pair<std::string, std::string>>;

class SnapshotServer {
 public:
  using Put = std::function<void(const std::string& key, int64_t step, SnapshotFiles files)>;
  using Get = std::function<std::optional<SnapshotFiles>(const std::string& key, int64_t step)>;
  // Listens on `host`:0 (all interfaces when empty) and serves requests on a thread of its own,
  // one connection at a time. Throws UnavailableError when it cannot listen.
  SnapshotServer(const std::string& host, Put put, Get get);
  ~SnapshotServer();
  int port() const;

 private:
  void handle(int fd);

  Put put_;
  Get get_;
  std::unique_ptr<tcp::Server> server_;  // last: its thread calls handle()
};

// Sends a snapshot to the agent at `address` (host:port). Throws UnavailableError naming the
// address when it cannot be delivered within `timeout`.
void put_snapshot(const std::string& address, const std::string& key, int64_t step,
                  const SnapshotFiles& files, std::chrono::milliseconds timeout);
// Fetches a snapshot from the agent at `address`: nullopt when it does not hold it. Throws
// UnavailableError naming the address on a network error.
std::optional<SnapshotFiles> get_snapshot(const std::string& address, const std::string& key,
                                          int64_t step, std::chrono::milliseconds timeout);

}  // namespace dtrain::fault
