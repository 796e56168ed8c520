// The coordination service's state in an etcd cluster (a CoordinationBackend): every service
// started on the same etcd with the same prefix serves one state, so a launcher on each node can
// host its own service and the job's coordination outlives any of them. Same semantics as
// CoordinationState, built from etcd reads and compare-and-swap transactions:
//   <prefix>kv/<key>         values and counters (set, get, add, wait, get_prefix)
//   <prefix>hb/<task>        a heartbeat: a value that changes at every beat
//   <prefix>barrier/<name>   {"count","arrived","round"}, updated by compare-and-swap
//   <prefix>round/pending    the membership round being formed: {"max","min","members"}
//   <prefix>round/current    the last completed round: {"generation","members"}
//   <prefix>round/g<N>       completed round N, for members that see it late
// A round closes (by whichever waiting member sees the condition first, in one transaction
// conditioned on nobody having changed the round since) when max members joined, or at least
// min and the pending round did not change for `settle`, timed on the waiter's own clock.
// Heartbeat ages are measured on this host from when it first saw each task's beat change.
// Private to src/distribute. Thread-safe.
#pragma once

#include <memory>
#include <string>

#include "distribute/coordination_backend.h"

namespace dtrain::distribute {

// Connects to the etcd cluster of `url` (etcd://...). Throws InvalidArgumentError for a
// malformed URL, UnavailableError naming the endpoints when none answers.
std::unique_ptr<CoordinationBackend> make_etcd_coordination_state(const std::string& url,
                                                                  const std::string& prefix);

}  // namespace dtrain::distribute
