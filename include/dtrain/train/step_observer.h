// A process-wide hook that fit() calls after every training step with the global step number,
// so that layers above train (the fault layer's progress reporter for the launcher's watchdog)
// can observe progress without train depending on them. The observer must be cheap and must
// not block or throw. Thread-safe: set_step_observer may race with fit(); the observer is called
// on the thread that runs fit().
//
// DTRAIN_STEP_TIMES=<file> (a measurement aid, read once): every process that trains also appends
// "<pid> <global step> <unix time, ns resolution>" to <file> for each step, in blocks of 64 lines
// and at a normal exit (a process killed with SIGKILL loses at most its last 63). Several
// processes may share one file (O_APPEND). bench/kill_loop.sh computes each failure's cost from
// it (bench/failure_cost.py).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace dtrain::train {

// Replaces the observer (an empty function removes it).
void set_step_observer(std::function<void(int64_t global_step)> observer);
// Calls the observer, if any, with `global_step`.
void notify_step(int64_t global_step);

// Where a worker resumed (the generation it resumed in, the global step, the checkpoint's name),
// for the launcher's account of a recovery. The fault layer's progress reporter takes it and
// sends it on its own connection, off the training thread. The observer must not block or throw.
using ResumeObserver =
    std::function<void(int64_t generation, int64_t global_step, const std::string& checkpoint)>;
// Replaces the resume observer (an empty function removes it).
void set_resume_observer(ResumeObserver observer);
// Calls the resume observer; false when none is set (the caller reports another way).
bool notify_resumed(int64_t generation, int64_t global_step, const std::string& checkpoint);

}  // namespace dtrain::train
