// Fault events: what `dtrain launch` records about every failure, detection, restart and
// recovery, as JSON lines (summary::EventLog, `--event-log FILE`) and as TensorBoard text entries
// and scalars (summary::SummaryWriter, `--logdir DIR` writes DIR/launcher). docs/fault-tolerance.md
// lists the kinds and fields. FaultRecorder is thread-safe (one mutex).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace dtrain::summary {
class EventLog;
class SummaryWriter;
}  // namespace dtrain::summary

namespace dtrain::fault {

// Kinds of fault events (the "kind" field).
inline constexpr const char* kEventStart = "start";      // a generation's workers started
inline constexpr const char* kEventFailure = "failure";  // the first failure of a generation
inline constexpr const char* kEventPeerFailure = "peer_failure";  // a worker failed because of it
inline constexpr const char* kEventStopped = "stopped";  // a worker stopped by the launcher
inline constexpr const char* kEventRestart = "restart";  // the group restarts
// --on-failure survivors: only the failed workers restart; the others keep running.
inline constexpr const char* kEventSurvivors = "survivors";
inline constexpr const char* kEventExclude = "exclude";      // a slot or node is excluded
inline constexpr const char* kEventResumed = "resumed";      // restarted workers resumed
inline constexpr const char* kEventRecovered = "recovered";  // first step after a restart
inline constexpr const char* kEventGiveUp = "give_up";       // no restart left, or too few
inline constexpr const char* kEventPreempted = "preempted";  // preemption: no restart
inline constexpr const char* kEventSignal = "signal";        // the launcher got a signal
inline constexpr const char* kEventAdmit = "admit";          // elastic: a node wants in
inline constexpr const char* kEventCompleted = "completed";  // every worker exited with 0
// --spares K (hot spares): a standby worker was started, stands by (data loaded, model built,
// connected), died while standing by (replaced; not a worker failure), took over a failed rank.
inline constexpr const char* kEventSpareStarted = "spare_started";
inline constexpr const char* kEventSpareReady = "spare_ready";
inline constexpr const char* kEventSpareLost = "spare_lost";
inline constexpr const char* kEventSpareTakeover = "spare_takeover";
// --spare-start fork: the spares' fork server (train/standby.h) started, stands by, refused to
// fork (it had threads) or was lost; extra "state": started, ready, refused, lost.
inline constexpr const char* kEventSpareForkServer = "spare_fork_server";

// Detectors (the "detector" field).
inline constexpr const char* kDetectExit = "exit";              // waitpid: non-zero exit, signal
inline constexpr const char* kDetectCollective = "collective";  // exit with UNAVAILABLE/DEADLINE
inline constexpr const char* kDetectHeartbeat = "heartbeat";    // heartbeat age > timeout
inline constexpr const char* kDetectWatchdog = "watchdog";      // step did not advance in time

struct FaultEvent {
  std::string kind;                        // one of kEvent*
  double time = 0;                         // when it happened, Unix seconds; 0: when recorded
  int64_t generation = 0;                  // the generation it happened in (restart: the new one)
  std::optional<int> rank = std::nullopt;  // global rank of the worker concerned
  std::optional<int> node = std::nullopt;  // node id (--node-rank) concerned
  std::optional<int> slot = std::nullopt;  // worker slot on its node
  std::optional<int64_t> pid = std::nullopt;
  std::optional<int> exit_code = std::nullopt;   // as shells report it: 128 + signal when signalled
  std::optional<int> signal = std::nullopt;      // the signal that ended it
  std::string detector = "";                     // one of kDetect*, for failures
  std::optional<int> cause_rank = std::nullopt;  // peer_failure / stopped: the first failure's rank
  std::optional<int64_t> last_step = std::nullopt;     // newest step reported before it
  std::optional<int64_t> resumed_step = std::nullopt;  // resumed / recovered
  std::string checkpoint = "";                         // resumed from (when workers said)
  std::optional<int64_t> lost_steps = std::nullopt;    // last_step - resumed_step
  std::optional<double> lost_seconds = std::nullopt;   // downtime + recomputation (estimate)
  std::optional<double> detection_latency_seconds = std::nullopt;  // last sign of life → detection
  std::optional<double> recovery_seconds = std::nullopt;  // detection → first step after restart
  std::optional<int> restarts = std::nullopt;             // restarts so far
  std::optional<int> world_size = std::nullopt;           // restart / start
  std::string stack = "";    // hang: what the worker was doing (gdb backtraces, /proc state)
  std::string message = "";  // one line for people; also the TensorBoard text entry
  std::map<std::string, std::string> extra = {};  // more fields, as strings
};

// The event as one JSON object: {"time": unix seconds (event.time, else unix_time),
// "generation", "kind", ...}; absent optionals are left out.
std::string to_json(const FaultEvent& event, double unix_time);

struct FaultRecorderOptions {
  std::string event_log = "";  // JSON-lines file; empty: none
  std::string logdir = "";     // TensorBoard directory (events go straight into it); empty: none
  bool echo = false;           // also print each message on stderr, prefixed "[launch] "
};

class FaultRecorder {
 public:
  // Opens the log and creates the event file. Throws an Error naming the path when it cannot.
  explicit FaultRecorder(const FaultRecorderOptions& options);
  // Flushes and closes; errors are swallowed.
  ~FaultRecorder();
  FaultRecorder(const FaultRecorder&) = delete;
  FaultRecorder& operator=(const FaultRecorder&) = delete;

  // Appends `event` to the JSON-lines log and writes its message as a TensorBoard text entry
  // (tag "launcher/events", at step last_step or 0), and the scalars it carries:
  // launcher/restarts, launcher/detection_latency_s, launcher/recovery_s, launcher/lost_steps,
  // launcher/lost_s, launcher/world_size. Never throws: an I/O error is reported once on stderr.
  // Blocks on the log's write.
  void record(const FaultEvent& event);
  // Writes buffered TensorBoard events to the file. Never throws.
  void flush();

 private:
  FaultRecorderOptions options_;
  std::mutex mu_;
  std::unique_ptr<summary::EventLog> log_;
  std::unique_ptr<summary::SummaryWriter> writer_;
  bool warned_ = false;
};

}  // namespace dtrain::fault
