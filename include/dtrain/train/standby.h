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
#pragma once

#include <cstdint>
#include <optional>

namespace dtrain::train {

inline constexpr const char* kEnvSpare = "DTRAIN_SPARE";
inline constexpr const char* kEnvSpareService = "DTRAIN_SPARE_SERVICE";
inline constexpr const char* kEnvSpareKey = "DTRAIN_SPARE_KEY";

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
