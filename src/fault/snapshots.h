// The launcher's in-memory snapshots (docs/fault-tolerance.md, "State from memory"). Each
// `dtrain launch` agent owns a directory on tmpfs (/dev/shm/dtrain-snapshots-<run>-n<node>-p<pid>)
// into which its workers write their snapshots (train/memory_snapshots.h; one subdirectory per
// world size and rank, "w<W>-r<R>"); the agent outlives the workers, so their snapshots survive
// a worker's death. A replicator thread pushes each rank's newest committed snapshot to the
// ring neighbour (the next member node) over TCP (snapshot_wire.h), which holds it in its own
// process memory, so a node whose agent is gone is recovered from there.
//
// Before a generation's workers start, every member agent publishes what it holds on the
// coordination service, all compute the same newest step that every rank of the new world holds
// somewhere, fetch what their own workers lack from the agent that has it, and pass each worker
// the snapshot to restore (DTRAIN_SNAPSHOT_RESTORE). With no complete set, the workers restore
// from their backups on disk, as without snapshots. Private to src/fault.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/distribute/coordination.h"
#include "dtrain/fault/fault_events.h"
#include "fault/launch_rendezvous.h"
#include "fault/snapshot_wire.h"

namespace dtrain::fault {

inline constexpr const char* kEventSnapshotRestore = "snapshot_restore";

struct SnapshotKeeperOptions {
  int64_t every = 10;     // --snapshot-every (0: no snapshots, no keeper)
  std::string root = "";  // --snapshot-root; empty: /dev/shm (else the temp directory)
  std::string run_id = "default";
  int node = 0;           // --node-rank
  std::string host = "";  // the address other agents reach this one at
  int keep_per_rank = 6;  // a neighbour's snapshots held per rank (as a worker keeps)
  bool journal = true;    // the workers' commits (--snapshot-commit): journal, else files
};

// The address other agents reach this one at, given the coordination service's host:port:
// DTRAIN_HOST when set, loopback for a service on loopback, else the local address that routes
// to the service's host.
std::string snapshot_agent_host(const std::string& service);

class SnapshotKeeper {
 public:
  // Creates the directory (removing those of dead agents), starts the server and the
  // replicator. Throws UnavailableError / file errors naming what failed.
  explicit SnapshotKeeper(SnapshotKeeperOptions options);
  ~SnapshotKeeper();  // stops the threads and removes the directory

  // Before generation `g`'s workers start (restart: after a failure). Publishes the holdings,
  // agrees on the step, fetches what this node's workers lack, and records what happened.
  void prepare(const Generation& g, distribute::CoordinationClient& client, FaultRecorder& recorder,
               bool restart);
  // The snapshot variables for the worker of global rank `rank` in the prepared generation.
  std::vector<std::string> environment(int rank) const;
  // The prepared generation's snapshot for rank `rank` (prefix, where it came from), or nullopt
  // when there is no complete set (the workers restore from disk).
  std::optional<std::pair<std::string, std::string>> restore_of(int rank) const;
  const std::string& directory() const { return dir_; }

 private:
  struct Held {  // what one agent holds: key ("w<W>-r<R>") → steps
    std::string address;
    std::map<std::string, std::vector<int64_t>> steps;
  };
  Held holdings();
  // Committed snapshots of the local directory `key` (from its state file), oldest first.
  std::vector<int64_t> local_steps(const std::string& key) const;
  // Reads a committed local snapshot whole; nullopt when it vanished (or changed) meanwhile.
  std::optional<SnapshotFiles> read_local(const std::string& key, int64_t step) const;
  void store_peer(const std::string& key, int64_t step, SnapshotFiles files);
  // Hard-links this agent's own workers' committed snapshots of `step` (the step a neighbour's
  // replica just arrived for) into pinned/<key>/<step>/, so that the pair outlives the workers'
  // rotation: a lost neighbour's ranks are then recoverable together with this node's ranks
  // however far the replication lags. O(1) per file, nothing copied.
  void pin_local(int world_size, int64_t step);
  // The pinned steps of `key`, and the prefix of one ("" when not pinned).
  std::vector<int64_t> pinned_steps(const std::string& key) const;
  std::string pinned_prefix(const std::string& key, int64_t step) const;
  std::optional<SnapshotFiles> find(const std::string& key, int64_t step);
  void replicate();

  SnapshotKeeperOptions o_;
  std::string dir_;
  std::unique_ptr<SnapshotServer> server_;
  std::string address_;
  int world_size_ = 0;                  // the prepared generation's
  std::map<int, std::string> restore_;  // rank → prefix to restore
  std::map<int, std::string> source_;   // rank → where it came from

  std::mutex pin_mu_;  // serialises pin_local (server threads)
  std::mutex mu_;      // guards the fields below (server and replicator threads)
  std::condition_variable cv_;
  bool stop_ = false;
  std::string neighbour_;                                         // host:port; empty: none
  std::map<std::string, std::map<int64_t, SnapshotFiles>> peer_;  // a neighbour's snapshots
  std::map<std::string, int64_t> pushed_;                         // key → newest step pushed
  std::thread replicator_;
};

}  // namespace dtrain::fault
