// A hot spare's side of `dtrain launch --spares K` (docs/fault-tolerance.md, "Hot spares"). The
// launcher starts K standby copies of the job's command beside the workers, marked by
//   DTRAIN_SPARE          the spare's id (0, 1, ...: never reused within a job)
//   DTRAIN_SPARE_SERVICE  host:port of the launcher's coordination service
//   DTRAIN_SPARE_KEY      its keys there: <key>/ready (the spare's pid, once it stands by) and
//                         <key>/assign (JSON {"rank", "generation", "unset": [names],
//                         "set": ["NAME=value", ...]}, written by the launcher)
// and without a rank (no DTRAIN_RANK, so no heartbeats or progress). A training program loads its
// data and builds its model, then calls await_standby_assignment() before it makes its strategy
// and compiles (compile() binds the model to the strategy in scope): a spare blocks there (a
// wait on the coordination service, no polling) until the launcher hands it a failed worker's
// rank; the call then gives the process exactly the environment a restarted worker of that rank
// would get (rank, generation, DTRAIN_SNAPSHOT_DIR, DTRAIN_SNAPSHOT_RESTORE, ...) and returns. The
// program goes on as that worker: it makes its strategy (joining the new generation's collectives),
// and fit() restores the agreed snapshot from the launcher's tmpfs, as a restarted worker does.
// Outside a spare, a no-op.
//
// Fork server (`dtrain launch --spare-start fork`; exec is the default): the launcher starts one
// more copy of the command, with DTRAIN_SPARE=fork-server and DTRAIN_SPARE_FORK_FD (one end of a
// SOCK_SEQPACKET socket to the launcher). It loads its data and builds its model like a spare, and
// in await_standby_assignment() it becomes the job's spare factory: for each request from the
// launcher ("fork <id> <key>", with the new spare's stdout and stderr as SCM_RIGHTS) it forks a
// copy of itself that is spare <id> (it shares the data and the built model copy-on-write and
// returns from await_standby_assignment() as a spare would) and answers "spare <id> <pid>". The
// copy is re-parented to the launcher (a child subreaper) by a double fork, so the launcher
// waits for it, signals its process group and takes it over as any spare. The server forks
// only while it is single-threaded (a fork copies one thread) and otherwise refuses ("refused
// <why>") and exits: the launcher then starts each spare with exec as before. It exits when the
// launcher closes the socket.
#pragma once

#include <cstdint>
#include <optional>

namespace dtrain::train {

inline constexpr const char* kEnvSpare = "DTRAIN_SPARE";
inline constexpr const char* kEnvSpareService = "DTRAIN_SPARE_SERVICE";
inline constexpr const char* kEnvSpareKey = "DTRAIN_SPARE_KEY";
inline constexpr const char* kEnvSpareForkFd = "DTRAIN_SPARE_FORK_FD";
// The launcher's snapshot directory on this node (its workers' snapshot directories are under
// it), when the job takes in-memory snapshots: a spare standing by makes its first snapshot
// slots there, sized as the workers' snapshots, on a thread at nice 19
// (SnapshotSlots::prepare_standby_slots).
inline constexpr const char* kEnvSpareSlotRoot = "DTRAIN_SPARE_SLOT_ROOT";
// DTRAIN_SPARE's value for the fork server.
inline constexpr const char* kSpareForkServer = "fork-server";

// Whether this process was started as a hot spare (DTRAIN_SPARE is set) and not assigned yet.
bool is_standby();

struct StandbyAssignment {
  int spare = 0;           // this spare's id
  int rank = 0;            // the rank it takes over
  int64_t generation = 0;  // the generation it joins
};

// A spare: tells the launcher it stands by, waits for its assignment, applies the assignment's
// environment and returns it. nullopt when this process is no spare. Call it once, on the main
// thread, before anything reads the launcher's variables (DTRAIN_RANK, ...). Throws
// InvalidArgumentError for a malformed DTRAIN_SPARE, UnavailableError when the service cannot be
// reached, DataLossError for a malformed assignment.
std::optional<StandbyAssignment> await_standby_assignment();

}  // namespace dtrain::train
