// Hot spares (`dtrain launch --spares K`, docs/fault-tolerance.md "Hot spares"): K standby copies
// of the job's command, started beside this node's workers with DTRAIN_SPARE set and no rank
// (train/standby.h is their side). Each loads its data, builds its model, connects to the
// coordination service, says so under dtrain/<run>/launch/spares/<id>/ready and blocks until
// the launcher writes its assignment (.../assign: a rank, a generation and the environment a
// restarted worker of that rank would get). take() hands a ready spare to a failed rank in
// place of a new process; tend() forwards the standby spares' output ("[spare N] "), replaces a
// spare that died while standing by (a spare_lost event; never a worker failure) and tops the
// set up to K in the background. A spare found stopped (SIGSTOP, a frozen VM's process) in two
// checks in a row is fenced: killed, so that it can never take a rank and resume, and replaced
// like a dead one; a stopped spare is never handed a rank. With `fork_server` (--spare-start fork)
// the spares are not started with exec: one more copy of the command, the fork server
// (train/standby.h), loads the data and builds the model once and forks each spare on request,
// which then costs milliseconds of CPU instead of a process start, a data load and a model build
// taken from the training workers; the launcher becomes a child subreaper so that the forked spares
// are its children. When the server refuses (it has threads), fails or dies, spares are started
// with exec from then on. Private to src/fault. Single-threaded (the launcher's loop).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/distribute/coordination.h"
#include "dtrain/fault/fault_events.h"
#include "fault/launch_util.h"
#include "fault/worker_process.h"

namespace dtrain::fault {

struct SparesOptions {
  int count = 0;                     // K
  std::string run_id = "default";    // keys under dtrain/<run>/launch/spares/n<node>/
  int node = 0;                      // --node-rank: each node's launcher keeps its own spares
  std::string service = "";          // host:port of the coordination service (for the spares)
  std::vector<std::string> command;  // the workers' command line
  // Variables a worker gets from the launcher (rank, generation, snapshots...): left out of a
  // spare's environment until its assignment sets them.
  std::vector<std::string> worker_variables;
  std::vector<std::string> set;  // "NAME=value" every spare gets (launcher pid, ...)
  bool fork_server = false;      // --spare-start fork (true) or exec (the default)
};

class Spares {
 public:
  Spares(SparesOptions options, distribute::CoordinationClient& client, FaultRecorder& recorder);
  // Kills (SIGKILL) and reaps every standby spare: they hold no state.
  ~Spares();
  Spares(const Spares&) = delete;
  Spares& operator=(const Spares&) = delete;

  // Forwards the standby spares' output, reaps the ones that died (spare_lost), notes the ones
  // that became ready (spare_ready, at most every 250 ms: one call to the service) and starts
  // new ones up to K (spare_started). Stops starting them after 3 spares in a row died before
  // they stood by (a broken command would otherwise be started forever). Never blocks on the
  // spares; `generation` is the current one, for the events.
  void tend(int64_t generation);

  // Hands a ready spare to rank `rank` of generation `generation`: writes its assignment
  // (`unset` names, `set` "NAME=value" pairs: a worker's environment) and returns its process,
  // which now is that worker (its output keeps the bytes not yet forwarded). Records
  // spare_takeover. nullopt when no spare is ready (the caller starts a process instead) or
  // the assignment cannot be written.
  struct Taken {
    int spare = 0;
    Process process;
  };
  std::optional<Taken> take(int rank, int64_t generation, const std::vector<std::string>& unset,
                            const std::vector<std::string>& set);

  // Standby spares that said they are ready.
  int ready() const;

 private:
  struct Spare {
    int id = 0;
    Process process;
    std::string prefix;
    bool ready = false;
    Clock::time_point started{};
    bool seen_stopped = false;  // stopped at the last check
    bool fenced = false;        // killed for being stopped; reap() replaces it
  };
  std::string key(int id) const;
  std::string prefix() const;  // dtrain/<run>/launch/spares/n<node>/
  void start_one(int64_t generation);
  void reap(int64_t generation);
  // Marks the spares whose ready key exists (one call to the service).
  void refresh_ready(int64_t generation);
  // Kills the spares (and the fork server) found stopped in this check and the last one.
  void fence_stopped(int64_t generation);
  // The fork server: started (false when it cannot be), a request for one spare, its answers,
  // and its end (spares are started with exec after it).
  bool start_fork_server(int64_t generation);
  void request_fork(int64_t generation);
  void read_fork_server(int64_t generation);
  void stop_fork_server(int64_t generation, const std::string& why, const char* state);

  struct ForkServer {
    Process process;
    int socket = -1;  // SOCK_SEQPACKET to the server
    bool ready = false;
    bool exited = false;  // reaped already
    Clock::time_point started{};
    std::optional<Spare> pending;  // requested; its pid comes in the answer
  };

  SparesOptions o_;
  distribute::CoordinationClient& client_;
  FaultRecorder& recorder_;
  std::vector<Spare> standby_;
  int next_id_ = 0;
  int died_unready_ = 0;  // spares in a row that died before they stood by
  bool gave_up_ = false;
  Clock::time_point next_ready_check_{};
  Clock::time_point next_stop_check_{};
  bool server_seen_stopped_ = false;
  std::optional<ForkServer> server_;
  bool fork_failed_ = false;  // spares are started with exec
};

}  // namespace dtrain::fault
