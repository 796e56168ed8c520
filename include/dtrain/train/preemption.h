// Preemption (a job manager's SIGTERM before it kills a pod or a Slurm job): the handler only
// records the request; fit() notices it at the next step boundary, agrees on that step with
// every worker of a multi-worker strategy (so all stop after the same step), lets callbacks
// save (BackupAndRestore backs up and waits for the commit), and throws PreemptedError. The
// dtrain binary exits with its exit_code(), preemption_exit_code() — 143 (128 + SIGTERM) unless
// DTRAIN_PREEMPTION_EXIT_CODE says otherwise — which Kubernetes/Kubeflow and Slurm requeue treat
// as retryable; a program of your own should do the same (catch it in main and return
// e.exit_code()). The next start resumes from that backup. Thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/core/error.h"

namespace dtrain::train {

// Thrown by fit() after a preemption, once every callback has saved what must survive: the
// process should exit with exit_code() so that its job manager restarts it.
class PreemptedError : public AbortedError {
 public:
  PreemptedError(int exit_code, const std::string& message, int64_t epoch, int64_t step)
      : AbortedError(message), exit_code_(exit_code), epoch_(epoch), step_(step) {}
  int exit_code() const { return exit_code_; }
  // Where training stopped: the 0-based epoch and the steps done in it.
  int64_t epoch() const { return epoch_; }
  int64_t step_in_epoch() const { return step_; }

 private:
  int exit_code_;
  int64_t epoch_;
  int64_t step_;
};

// Installs the SIGTERM handler (idempotent). fit() installs it when it backs up
// (save_checkpoints or a BackupAndRestore callback); call it yourself to cover other loops.
void install_preemption_handler();
// True once SIGTERM has arrived (or request_preemption() was called).
bool preemption_requested();
// Marks a preemption request, as SIGTERM does (for tests and custom signals).
void request_preemption();
// Clears the request (tests).
void clear_preemption_request();
// The exit code of a preempted process: DTRAIN_PREEMPTION_EXIT_CODE, else 143. Throws
// InvalidArgumentError naming the variable when it is not an integer in [1, 255].
int preemption_exit_code();

}  // namespace dtrain::train
