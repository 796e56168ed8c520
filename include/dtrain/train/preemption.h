// Preemption (a job manager's SIGTERM before it kills a pod or a Slurm job): the handler only
// records the request; fit() notices it at the next step boundary, agrees on that step with
// every worker of a multi-worker strategy (so all stop after the same step), lets callbacks
// save (BackupAndRestore backs up and waits for the commit), and exits the process with
// preemption_exit_code() — 143 (128 + SIGTERM) unless DTRAIN_PREEMPTION_EXIT_CODE says
// otherwise — which Kubernetes/Kubeflow and Slurm requeue treat as retryable. The next start
// resumes from that backup. Thread-safe.
#pragma once

namespace dtrain::train {

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
