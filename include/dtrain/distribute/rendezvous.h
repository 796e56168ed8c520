// Rendezvous: how the worker processes of one job find each other. A rendezvous runs over a
// KeyValueStore: the coordination service's store (the default in dtrain launch), Gloo's
// FileStore on a shared directory ("file:///shared/dir") or Gloo's RedisStore against a Redis
// server ("redis://host:6379"). Each rendezvous uses a fresh key prefix (a "generation"),
// because Gloo's rendezvous keys cannot be reused after a run or a failure.
// Functions are thread-safe; the stores they return are thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/distribute/key_value_store.h"

namespace dtrain::distribute {

// Opens the store that `url` names:
//   host:port            the coordination service there (CoordinationClient, 30 s to connect).
//   file:///shared/dir   Gloo's FileStore in that directory (created if missing); every worker
//                        must see the same directory (NFS, a shared volume, one machine).
//   redis://host[:port]  Gloo's RedisStore on a Redis server (port 6379 by default).
//   etcd://host[:port][,host[:port]...]
//                        an etcd cluster through its v3 API (port 2379 by default); calls fail
//                        over to the next endpoint when one is unreachable.
//   memory://name        a store in this process's memory, shared by every open_store() call
//                        with the same name (ranks as threads, for tests).
// Throws InvalidArgumentError naming the URL when it is malformed or its scheme unknown,
// UnavailableError when the Redis server cannot be reached (2 s connect timeout), no etcd
// endpoint answers within 5 s (the message names every endpoint), or the directory cannot be
// created.
std::shared_ptr<KeyValueStore> open_store(const std::string& url);

// What each worker publishes about itself at rendezvous.
struct PeerInfo {
  int rank = 0;
  int world_size = 0;  // the world size this worker was started with
  std::string host;    // the address its collectives listen on
  int64_t pid = 0;
  std::string task;  // e.g. "worker:1" (TF_CONFIG task), for error messages
};

struct RendezvousOptions {
  int rank = 0;                                      // this worker, in [0, world_size)
  int world_size = 1;                                // workers in the job
  std::string host = "";                             // published in PeerInfo
  std::string task = "";                             // published in PeerInfo
  std::string run_id = "default";                    // separates jobs sharing one store
  std::optional<int64_t> generation = std::nullopt;  // nullopt: the next one (see below)
  std::chrono::milliseconds timeout = std::chrono::seconds(30);  // for every peer to arrive
};

struct RendezvousResult {
  int64_t generation = 0;
  std::shared_ptr<KeyValueStore> store;  // `store` seen through this generation's prefix
  std::vector<PeerInfo> peers;           // indexed by rank; peers[rank] is this worker
};

// Joins a rendezvous on `store`: publishes this worker's PeerInfo under
// "dtrain/<run_id>/g<generation>/" and waits for ranks 0..world_size-1 to publish theirs.
// Without an explicit generation, each arriving worker takes a ticket from the counter
// "dtrain/<run_id>/arrivals" and joins generation (ticket - 1) / world_size, so a store can be
// reused by consecutive runs as long as every worker of each run arrives; a launcher that
// restarts groups passes the generation explicitly. Blocks up to `timeout`.
// Throws InvalidArgumentError when rank or world_size is out of range, or when peers were
// started with a different world size (naming both ranks and sizes); DeadlineExceededError
// naming the ranks that never arrived; UnavailableError when the store fails.
RendezvousResult rendezvous(const std::shared_ptr<KeyValueStore>& store,
                            const RendezvousOptions& options);

}  // namespace dtrain::distribute
