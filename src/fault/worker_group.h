// This node's worker group for one generation: starts a worker per active slot (each in its
// own process group, output through pipes), forwards their output with "[rank N] " prefixes,
// signals and reaps them. Private to src/fault. Single-threaded (the launcher's poll loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fault/launch_util.h"
#include "fault/worker_process.h"

namespace dtrain::fault {

struct Worker {
  int slot = 0;
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;          // also its process group
  int64_t generation = 1;  // the generation it was started in (its progress and heartbeat keys)
  bool running = false;
  int status = 0;  // waitpid status once exited
  int code = 0;    // exit code, or 128 + signal
  std::string prefix;
  Stream out, err;
  std::optional<int64_t> step;       // newest step it reported
  Clock::time_point step_changed{};  // when that value last changed (as seen here)
};

class WorkerGroup {
 public:
  // The environment of a worker's process, given its slot and ranks.
  using Environment = std::function<std::vector<std::string>(const Worker&)>;

  // Starts `command` once per slot in `slots` (local rank i, global rank rank_offset + i).
  // When one cannot be started, kills the ones already started and rethrows
  // (NotFoundError, FailedPreconditionError from spawn_process).
  // `take`, when given, may hand over a process already running for a worker (a hot spare,
  // spares.h) instead of a new one.
  using Take = std::function<std::optional<Process>(const Worker&)>;
  void start(const std::vector<std::string>& command, const std::vector<int>& slots,
             int rank_offset, const Environment& environment, const Take& take = {});

  // Starts worker `w` (exited) again in place: same slot and ranks, in generation `generation`
  // (--on-failure survivors). What is left of its old pipes is forwarded first. Throws as
  // start() does.
  void respawn(Worker& w, const std::vector<std::string>& command, int64_t generation,
               const Environment& environment);
  // As respawn(), with process `p` already running for it (a hot spare that took it over).
  void adopt(Worker& w, const Process& p, int64_t generation);
  // Stops every running worker: SIGTERM, SIGKILL after `grace`, then reaps them and closes
  // their output (the launcher falls back from survivors to restarting every worker).
  void stop(milliseconds grace);

  std::vector<Worker>& workers() { return workers_; }
  const std::vector<Worker>& workers() const { return workers_; }
  bool any_running() const;
  // Whether some worker's output pipe is still open.
  bool output_open() const;
  // Waits up to `timeout` for output (or for `wake_fd` to become readable) and forwards the
  // complete lines that arrived.
  void pump_output(int wake_fd, milliseconds timeout);
  // Reaps the workers that exited (without blocking) and returns them.
  std::vector<Worker*> reap();
  // Waits up to `timeout` for worker `w` (just sent SIGKILL) to exit and reaps it. False when it
  // is still there (a process in uninterruptible sleep).
  bool await_exit(Worker& w, milliseconds timeout);
  // Sends `sig` to the process group of every running worker.
  void signal(int sig);
  // Kills (SIGKILL) the workers still running after the grace period, saying so.
  void kill_stragglers();
  // Forwards what is left of every pipe and closes it; kills the process group of a worker
  // whose pipe outlived it (a grandchild holds it).
  void close_output();
  // The first non-zero exit code among the workers, or 0.
  int first_nonzero_code() const;

 private:
  std::vector<Worker> workers_;
};

}  // namespace dtrain::fault
