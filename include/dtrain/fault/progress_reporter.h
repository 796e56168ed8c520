// The worker side of the launcher's failure detection: a ProgressReporter tells the coordination
// service which training step this worker has reached (the key "progress/<generation>/<rank>",
// for `dtrain launch --watchdog-timeout`) and that it is alive (heartbeats of the task
// "worker/<generation>/<rank>", for `--heartbeat-timeout`). report() is called once per training
// step and costs one relaxed atomic store: a background thread sends the newest step at most
// every report interval. Thread-safe: report() may be called from any thread.
//
//   fault::install_progress_reporter();   // at program start; a no-op outside `dtrain launch`
//   model.fit(...);                       // fit's step observer reports every step
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::distribute {
class CoordinationClient;
}

namespace dtrain::fault {

// Seconds between a worker's heartbeats (decimal; 0 turns them off). Set by `dtrain launch
// --heartbeat-interval`; default 1.
inline constexpr const char* kEnvHeartbeatInterval = "DTRAIN_HEARTBEAT_INTERVAL";
// Seconds without a heartbeat after which the launcher treats a worker as dead (decimal; 0:
// never). Set by `dtrain launch --heartbeat-timeout`; default 10.
inline constexpr const char* kEnvHeartbeatTimeout = "DTRAIN_HEARTBEAT_TIMEOUT";
// Seconds between progress reports (decimal). Set by `dtrain launch`; default 0.1.
inline constexpr const char* kEnvProgressInterval = "DTRAIN_PROGRESS_INTERVAL";
// The worker's slot on its node, 0 .. --nproc-per-node - 1: stable across restarts, while
// DTRAIN_LOCAL_RANK is renumbered when a slot is excluded (use the slot to pick a device).
inline constexpr const char* kEnvWorkerSlot = "DTRAIN_WORKER_SLOT";
// Process id of the launcher, so a worker can allow it (and its gdb) to read its stacks.
inline constexpr const char* kEnvLauncherPid = "DTRAIN_LAUNCHER_PID";

// "progress/<generation>/<rank>": the newest training step the worker reached (decimal).
std::string progress_key(int64_t generation, int rank);
// "resumed/<generation>/<rank>": the step a restarted worker resumed at (decimal), written by
// BackupAndRestore (or report_resumed) after restoring a backup.
std::string resumed_key(int64_t generation, int rank);
// "resumed_from/<generation>/<rank>": optional, the checkpoint it resumed from ("ckpt-12").
std::string resumed_from_key(int64_t generation, int rank);
// "worker/<generation>/<rank>": the heartbeat task of a worker.
std::string worker_heartbeat_task(int64_t generation, int rank);

struct ProgressReporterOptions {
  std::string address = "";  // the coordination service, host:port (required)
  int64_t generation = 1;    // DTRAIN_RDZV_GENERATION
  int rank = 0;              // DTRAIN_RANK
  // Newest step sent at most this often.
  std::chrono::milliseconds report_interval = std::chrono::milliseconds(100);
  // Heartbeat period; 0: no heartbeats.
  std::chrono::milliseconds heartbeat_interval = std::chrono::seconds(1);
  // Heartbeats failing this long mean the launcher is gone (see terminate_on_lost_service).
  std::chrono::milliseconds heartbeat_timeout = std::chrono::seconds(10);
  // How long the constructor waits for the service.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // When heartbeats have failed for heartbeat_timeout (the launcher died, the host lost its
  // network), send SIGTERM to this process, so it checkpoints and exits as on preemption
  // instead of training on alone.
  bool terminate_on_lost_service = true;
};

class ProgressReporter {
 public:
  // Connects to the service (blocks up to options.connect_timeout; throws UnavailableError naming
  // the address after that), sends the first heartbeat and starts the sender thread.
  explicit ProgressReporter(const ProgressReporterOptions& options);
  // Sends the newest step one last time (bounded by about two seconds) and stops the threads.
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

  // A reporter for this worker when it runs under `dtrain launch` with a coordination service
  // (DTRAIN_RANK, DTRAIN_MASTER_ADDR/PORT set), configured from kEnvHeartbeat* and
  // kEnvProgressInterval; null otherwise. Also allows the launcher (kEnvLauncherPid) to ptrace
  // this process for stack traces. Throws InvalidArgumentError naming a malformed variable,
  // UnavailableError when the service cannot be reached within 30 s.
  static std::unique_ptr<ProgressReporter> from_environment();

  // Records that training reached `step`. Never blocks, allocates or throws: the sender thread
  // sends the newest value within report_interval.
  void report(int64_t step) noexcept { step_.store(step, std::memory_order_relaxed); }
  // Writes resumed_key (and resumed_from_key when `checkpoint` is not empty) now, so the
  // launcher can say what a restart lost. Blocks for one RPC; throws UnavailableError.
  void report_resumed(int64_t step, const std::string& checkpoint = "");
  // The same for `generation` (a survivor's next one), sent by the sender thread before any
  // later step; never blocks or throws (a failed send is reported on stderr once).
  void queue_resumed(int64_t generation, int64_t step, std::string checkpoint);

  int64_t generation() const { return options_.generation; }
  int rank() const { return options_.rank; }
  // The newest step sent to the service (-1: none yet).
  int64_t last_sent() const { return sent_.load(std::memory_order_relaxed); }
  // The connection (shared with the heartbeat thread; thread-safe).
  distribute::CoordinationClient& client() { return *client_; }

 private:
  void send_loop();

  ProgressReporterOptions options_;
  std::string key_;
  std::unique_ptr<distribute::CoordinationClient> client_;
  std::atomic<int64_t> step_{-1};
  std::atomic<int64_t> sent_{-1};
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  struct Resumed {
    int64_t generation;
    int64_t step;
    std::string checkpoint;
  };
  std::vector<Resumed> resumed_;  // guarded by mu_: queued by queue_resumed, not sent yet
  std::thread sender_;
};

// Creates ProgressReporter::from_environment() once per process and registers it as train's
// step observer (train::set_step_observer), so fit() reports every step. Returns it, or null
// when not under `dtrain launch` (then it does nothing). Idempotent; thread-safe. Throws like
// from_environment().
ProgressReporter* install_progress_reporter();
// Removes the step observer and destroys the installed reporter (sending its last step).
void uninstall_progress_reporter();

}  // namespace dtrain::fault
