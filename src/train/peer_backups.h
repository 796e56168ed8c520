// Durable backups without a shared filesystem (docs/fault-tolerance.md, "No shared filesystem").
// Under `dtrain launch` with several nodes and replicated state, the first worker of every host
// writes a full copy of each backup into its own --checkpoint-dir (that host's disk). When the
// workers resume from disk, each first restores the newest valid backup of its own host's
// directory; then they agree, over one all-gather, on the newest backup any of them holds, and a
// worker whose host lacks it fetches its files from a worker that holds it (backup_transfer.h;
// sizes and CRC-32C checked, nothing kept unless complete) and restores that copy. No worker
// ever reads another host's directory. Private to src/train; used by BackupAndRestore only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dtrain::checkpoint {
class Checkpoint;
struct ShardedSaveOptions;
}  // namespace dtrain::checkpoint
namespace dtrain::nn {
class Model;
}
namespace dtrain::distribute {
class Strategy;
}

namespace dtrain::train {

// Where a worker announces how it got its backup, for its launcher's event log: JSON
// {"source": "local_disk"|"peer_disk", "from_node": <node index>, "from_rank", "checkpoint",
// "step", "bytes"} under backup_restore/<generation>/<rank> on the coordination service.
std::string backup_restore_key(int64_t generation, int rank);

// Whether backups are kept per host: under `dtrain launch` with several nodes and a strategy
// with several workers. The same answer on every worker.
bool backups_per_host(const distribute::Strategy* strategy);
// Whether this worker writes its host's copy: the first worker of its node (local rank 0).
bool writes_host_copy();

// Sharded backups kept per host: the save options that shard each backup over this host's own
// workers (its host writer, local rank 0, first: it merges the index and commits), so that every
// host's directory holds a whole sharded checkpoint written by its workers in parallel (every
// worker holds the whole state when a backup is taken). The three all-gathers of a save stay the
// job's; each host reads its own workers' part. `locked_out`: this worker is its host's writer
// and found its directory locked by another host's. Every worker calls this at the same point
// (one all-gather). nullopt when some host writer was locked out (a directory shared between
// hosts): then one sharded checkpoint for the whole job is written there instead.
std::optional<checkpoint::ShardedSaveOptions> host_sharding(distribute::Strategy& strategy,
                                                            nn::Model& model, bool locked_out);

// Every worker calls this at the same point of fit(), after restoring the newest valid backup of
// its host's directory `dir` into `ckpt` (`local`: that prefix, or nullopt when there was none).
// `restored_step` gives the global step of the state restored into `ckpt`. The workers agree on
// the newest step any of them restored; a worker behind it fetches that backup from a worker
// that holds it and restores it. Returns the prefix now restored (nullopt: no worker had a
// backup; fit starts fresh). Blocks on the strategy's collectives and on the transfers. Throws
// what a transfer or restore throws on the worker that failed (UnavailableError when the peer
// disappeared mid-transfer, DataLossError for a corrupt copy, ResourceExhaustedError for a full
// disk), and FailedPreconditionError naming the failed workers on the others, so every worker
// stops rather than train from different states.
std::optional<std::string> agree_on_host_backups(distribute::Strategy& strategy,
                                                 checkpoint::Checkpoint& ckpt,
                                                 const std::string& dir,
                                                 const std::optional<std::string>& local,
                                                 const std::function<int64_t()>& restored_step);

}  // namespace dtrain::train
