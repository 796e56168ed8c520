// The launcher agent (see launch_agent.h): one poll loop per generation reads the workers' pipes,
// reaps them, handles signals (self-pipe), and every monitor period reads the workers' progress
// and heartbeats from the coordination service. Between generations it stops the group, joins the
// next membership round and starts the group again. Single-threaded; the coordination server and
// clients run their own threads.
#include "dtrain/fault/launch_agent.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/fault/fault_events.h"
#include "dtrain/fault/progress_reporter.h"
#include "fault/worker_process.h"

namespace dtrain::fault {

bool FailureHistory::record(int id, Clock::time_point at) {
  failures_[id].push_back(at);
  return threshold_ > 0 && count(id, at) >= threshold_;
}

int FailureHistory::count(int id, Clock::time_point at) {
  auto& q = failures_[id];
  while (!q.empty() && q.front() + window_ < at) q.pop_front();
  return static_cast<int>(q.size());
}

std::pair<int, int> parse_nnodes(const std::string& text) {
  const auto parse = [&](std::string_view s) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 1) {
      throw InvalidArgumentError(
          str_cat("launch: --nnodes '", text, "' is not N or MIN:MAX with 1 <= MIN <= MAX"));
    }
    return v;
  };
  const size_t colon = text.find(':');
  if (colon == std::string::npos) {
    const int n = parse(text);
    return {n, n};
  }
  const int lo = parse(std::string_view(text).substr(0, colon));
  const int hi = parse(std::string_view(text).substr(colon + 1));
  if (lo > hi) {
    throw InvalidArgumentError(str_cat("launch: --nnodes '", text, "': MIN is larger than MAX"));
  }
  return {lo, hi};
}

namespace {

namespace dist = dtrain::distribute;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using json = nlohmann::json;

constexpr milliseconds kMonitorPeriod(250);  // progress, heartbeats, other nodes

// Whether process `pid` is stopped (by a signal or a tracer): state T or t in /proc/<pid>/stat.
bool process_stopped(pid_t pid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return false;
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')' (comm may contain parentheses).
  const char* close = std::strrchr(buf, ')');
  if (n == 0 || close == nullptr || close[1] != ' ') return false;
  return close[2] == 'T' || close[2] == 't';
}
constexpr int kUnavailableCode = 5;  // docs/errors.md: a lost peer
constexpr int kDeadlineCode = 6;     // docs/errors.md: a timeout

milliseconds ms_of(double seconds) {
  return milliseconds(static_cast<int64_t>(std::llround(seconds * 1000)));
}
double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
std::string fixed(double v, int digits = 1) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::optional<int64_t> parse_int(const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

// "how it ended" for messages: "exited with code 7", "exited on signal 9 (Killed)".
std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    return str_cat("exited on signal ", WTERMSIG(status), " (", strsignal(WTERMSIG(status)), ")");
  }
  return str_cat("exited with code ", exit_code_of(status));
}

struct Worker {
  int slot = 0;
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;  // also its process group
  bool running = false;
  int status = 0;  // waitpid status once exited
  int code = 0;    // exit code, or 128 + signal
  std::string prefix;
  Stream out, err;
  std::optional<int64_t> step;       // newest step it reported
  Clock::time_point step_changed{};  // when that value last changed (as seen here)
};

// One generation as this node sees it.
struct Generation {
  int64_t number = 1;
  std::vector<int> nodes;  // member node ids, in rank order
  int node_index = 0;      // this node's position (DTRAIN_NODE_RANK)
  int world_size = 0;
  int rank_offset = 0;
  std::vector<int> slots;  // this node's active slots
};

// What ended a generation (or what this node learned about it).
struct Failure {
  std::string detector = kDetectExit;
  int code = 1;  // the exit code the launcher will return if it does not restart
  std::optional<int> rank, node, slot, signal;
  std::optional<int64_t> pid, last_step;
  Clock::time_point detected_at{};
  double detected_unix = 0;  // the same, Unix seconds
  std::optional<double> detection_latency;
  bool ours = false;        // the first failure is one of this node's workers (or this node)
  bool preemption = false;  // no restart
  bool admit = false;       // not a failure: elastic scale-up
  bool exclude = false;     // multi-node: the failed node excludes itself
  bool lost_service = false;
  bool remote = false;  // learned from another node's report (that node recorded it)
  std::string what;     // "worker 1 exited on signal 9 at step 1234"
  std::string stack;    // hang: what it was doing
};

enum class End { kCompleted, kFailure, kSignal };

struct Outcome {
  End end = End::kCompleted;
  int code = 0;
  std::optional<Failure> failure;
};

// Following a restart until the workers train again.
struct Recovery {
  Failure failure;
  int64_t generation = 0;
  std::optional<double> step_seconds;  // mean step time before the failure
  bool resumed_recorded = false;
  std::optional<int64_t> resumed_step;
  std::string checkpoint;
};

class Agent {
 public:
  explicit Agent(const LaunchOptions& o) : o_(o) {}
  int run();

 private:
  bool multi_node() const { return o_.max_nodes > 1; }
  void start_service();
  dist::CoordinationClientOptions client_options(milliseconds connect_timeout) const;
  Generation form_generation();
  void spawn_group(const Generation& g, std::vector<Worker>& workers);
  Outcome supervise(const Generation& g, std::vector<Worker>& workers);
  void monitor(const Generation& g, std::vector<Worker>& workers,
               const std::function<void(Failure)>& fail);
  bool publish(const Generation& g, Failure& f);
  std::optional<Failure> remote_failure(const Generation& g);
  void track_recovery(const Generation& g, const std::map<std::string, std::string>& progress);
  FaultEvent event(const char* kind, int64_t generation) const;
  // An event about failure `f`: its worker (rank, node, slot, pid), how it ended (exit code,
  // signal), its detector and last step.
  FaultEvent event(const char* kind, int64_t generation, const Failure& f) const;
  int finish(const Generation& g, int code);
  std::string key(const Generation& g, const std::string& name) const {
    return str_cat(prefix_, "g", g.number, "/", name);
  }

  LaunchOptions o_;
  std::unique_ptr<dist::CoordinationServer> server_;
  std::unique_ptr<dist::CoordinationClient> client_;  // null: multi-node on a store URL
  bool lost_service_ = false;  // calls to the service failed: reconnect before the next round
  std::string service_;        // host:port workers connect to
  std::string prefix_;         // "dtrain/<run>/launch/"
  std::unique_ptr<FaultRecorder> recorder_;
  std::unique_ptr<SignalRelay> signals_;
  int restarts_ = 0;
  FailureHistory slot_history_{0, milliseconds(0)};
  FailureHistory node_history_{0, milliseconds(0)};
  std::set<int> excluded_slots_;
  std::optional<Recovery> recovery_;
  std::optional<int64_t> job_step_;  // newest step any worker reported, this generation
  std::optional<std::pair<int64_t, Clock::time_point>> first_progress_;  // for the step time
  int received_signal_ = 0;
};

FaultEvent Agent::event(const char* kind, int64_t generation) const {
  FaultEvent e;
  e.kind = kind;
  e.generation = generation;
  return e;
}

FaultEvent Agent::event(const char* kind, int64_t generation, const Failure& f) const {
  FaultEvent e = event(kind, generation);
  e.rank = f.rank;
  e.node = f.node;
  e.slot = f.slot;
  e.pid = f.pid;
  e.exit_code = f.code;
  e.signal = f.signal;
  e.detector = f.detector;
  e.last_step = f.last_step;
  return e;
}

void Agent::start_service() {
  const bool store_url = o_.rdzv.find("://") != std::string::npos;
  if (o_.rdzv == "coordinator" || (store_url && !multi_node())) {
    server_ = std::make_unique<dist::CoordinationServer>(
        dist::CoordinationServerOptions{.address = "127.0.0.1:0"});
    service_ = server_->address();
  } else if (!store_url) {
    service_ = o_.rdzv;
    if (o_.node_rank == 0) {
      server_ = std::make_unique<dist::CoordinationServer>(
          dist::CoordinationServerOptions{.address = o_.rdzv});
      say("coordination service listening on ", server_->address());
    }
  }
  if (service_.empty()) return;
  client_ = std::make_unique<dist::CoordinationClient>(service_,
                                                       client_options(ms_of(o_.rdzv_timeout_s)));
}

dist::CoordinationClientOptions Agent::client_options(milliseconds connect_timeout) const {
  dist::CoordinationClientOptions co{.connect_timeout = connect_timeout,
                                     .rpc_timeout = std::chrono::seconds(10)};
  // A node away from the service that gets no answer for its heartbeat timeout is as good as
  // lost to the others (they stop waiting for it then): its calls give up as soon, not under 2 s.
  if (multi_node() && server_ == nullptr && o_.heartbeat_timeout_s > 0) {
    co.rpc_timeout = std::clamp(ms_of(o_.heartbeat_timeout_s), milliseconds(2000), co.rpc_timeout);
  }
  if (multi_node() && o_.heartbeat_interval_s > 0) {
    co.heartbeat_task = str_cat("node/", o_.node_rank);
    co.heartbeat_interval = ms_of(o_.heartbeat_interval_s);
    co.heartbeat_timeout = std::chrono::hours(24 * 365);  // keep trying: the link may return
  }
  return co;
}

Generation Agent::form_generation() {
  Generation g;
  for (int s = 0; s < o_.nproc_per_node; ++s) {
    if (excluded_slots_.count(s) == 0) g.slots.push_back(s);
  }
  if (client_ == nullptr) {  // multi-node on a shared store: fixed membership, no restarts
    g.nodes.resize(o_.max_nodes);
    for (int n = 0; n < o_.max_nodes; ++n) g.nodes[n] = n;
    g.node_index = o_.node_rank;
    g.world_size = o_.max_nodes * o_.nproc_per_node;
    g.rank_offset = o_.node_rank * o_.nproc_per_node;
    return g;
  }
  const auto timeout = ms_of(o_.rdzv_timeout_s);
  const auto deadline = Clock::now() + timeout;
  const auto remaining = [&] {
    return std::max(milliseconds(1),
                    std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  };
  dist::Membership m;
  int available = o_.max_nodes;
  // A node cut off from the service (its link went down, a switch failed) keeps trying until
  // --rdzv-timeout: on a fresh connection, since the old one may lead nowhere, and then into
  // the next round, where the running nodes see it waiting and admit it.
  bool said = false;
  const auto say_retrying = [&](const std::string& why) {
    if (said) return;
    say("node ", o_.node_rank, " cannot reach the coordination service at ", service_, " (", why,
        "); retrying until --rdzv-timeout (", o_.rdzv_timeout_s, " s)");
    said = true;
  };
  if (lost_service_) say_retrying("lost it during the last generation");
  while (true) {
    try {
      if (lost_service_) {
        client_.reset();  // stops its heartbeats
        client_ = std::make_unique<dist::CoordinationClient>(service_, client_options(remaining()));
        lost_service_ = false;
        say("node ", o_.node_rank, " reached the coordination service again; rejoining");
      }
      available = o_.max_nodes;
      if (multi_node()) {
        const auto excluded = client_->get_prefix(prefix_ + "excluded/");
        available -= static_cast<int>(excluded.size());
        if (available < o_.min_nodes) {
          throw FailedPreconditionError(str_cat("launch: ", excluded.size(),
                                                " node(s) excluded; fewer than --nnodes minimum ",
                                                o_.min_nodes, " remain"));
        }
      }
      m = client_->join(str_cat("node-", o_.node_rank),
                        dist::JoinOptions{.max_members = available,
                                          .min_members = std::min(o_.min_nodes, available),
                                          .settle = ms_of(o_.rdzv_settle_s),
                                          .timeout = remaining()});
      break;
    } catch (const Error& e) {
      // UNAVAILABLE, or no answer in time on a connection that leads nowhere. (A round that did
      // not fill answers DEADLINE_EXCEEDED at the deadline, and that ends the wait.)
      const bool unreachable =
          e.code() == ErrorCode::kUnavailable || e.code() == ErrorCode::kDeadlineExceeded;
      if (!unreachable || Clock::now() >= deadline) throw;
      say_retrying(e.what());
      lost_service_ = true;
      std::this_thread::sleep_for(milliseconds(500));
    }
  }
  g.number = m.generation;
  for (const auto& member : m.members) {
    g.nodes.push_back(static_cast<int>(parse_int(member.substr(member.find('-') + 1)).value_or(0)));
  }
  std::sort(g.nodes.begin(), g.nodes.end());
  g.node_index =
      static_cast<int>(std::find(g.nodes.begin(), g.nodes.end(), o_.node_rank) - g.nodes.begin());
  if (!multi_node()) {
    g.world_size = static_cast<int>(g.slots.size());
    return g;
  }
  client_->set(key(g, str_cat("nproc/", o_.node_rank)), std::to_string(g.slots.size()));
  for (int node : g.nodes) {
    const int n = static_cast<int>(
        parse_int(client_->get(key(g, str_cat("nproc/", node)), timeout)).value_or(0));
    if (node < o_.node_rank) g.rank_offset += n;
    g.world_size += n;
  }
  return g;
}

void Agent::spawn_group(const Generation& g, std::vector<Worker>& workers) {
  workers.assign(g.slots.size(), Worker{});
  dist::LauncherEnv env{.local_world_size = static_cast<int>(g.slots.size()),
                        .node_rank = g.node_index,
                        .nnodes = static_cast<int>(g.nodes.size()),
                        .rdzv = o_.rdzv.find("://") != std::string::npos ? o_.rdzv : service_,
                        .generation = g.number,
                        .run_id = o_.run_id};
  env.world_size = g.world_size;
  if (!service_.empty()) env.master = dist::parse_host_port(service_, "coordination service");
  double progress_interval = 0.1;
  if (o_.watchdog_timeout_s > 0) progress_interval = std::min(0.1, o_.watchdog_timeout_s / 4);
  const auto now = Clock::now();
  for (size_t i = 0; i < g.slots.size(); ++i) {
    Worker& w = workers[i];
    w.slot = g.slots[i];
    w.local_rank = static_cast<int>(i);
    w.rank = g.rank_offset + w.local_rank;
    w.prefix = str_cat("[rank ", w.rank, "] ");
    w.step_changed = now;
    dist::LauncherEnv we = env;
    we.rank = w.rank;
    we.local_rank = w.local_rank;
    std::vector<std::string> set;
    for (const auto& [k, v] : we.to_variables()) set.push_back(k + "=" + v);
    set.push_back(str_cat(kEnvWorkerSlot, "=", w.slot));
    set.push_back(str_cat(kEnvLauncherPid, "=", ::getpid()));
    set.push_back(str_cat(kEnvHeartbeatInterval, "=", o_.heartbeat_interval_s));
    set.push_back(str_cat(kEnvHeartbeatTimeout, "=", o_.heartbeat_timeout_s));
    set.push_back(str_cat(kEnvProgressInterval, "=", progress_interval));
    set.push_back(str_cat("DTRAIN_PREEMPTION_EXIT_CODE=", o_.preemption_exit_code));
    try {
      const Process p = spawn_process(
          o_.command, environment_with({dist::kEnvMasterAddr, dist::kEnvMasterPort}, set),
          str_cat("rank ", w.rank));
      w.pid = p.pid;
      w.out = p.out;
      w.err = p.err;
      w.running = true;
    } catch (...) {
      for (auto& started : workers) {
        if (started.running) {
          ::kill(-started.pid, SIGKILL);
          ::waitpid(started.pid, nullptr, 0);
          ::close(started.out.fd);
          ::close(started.err.fd);
          started.running = false;
        }
      }
      throw;
    }
  }
}

// Publishes this node's view of the generation's first failure to the other nodes. Returns
// true when it is the job's first (this node won); false when another node's came first.
bool Agent::publish(const Generation& g, Failure& f) {
  if (!multi_node() || client_ == nullptr) return true;
  try {
    if (client_->add(key(g, "failures"), 1) != 1) return false;
    if (f.ours && !f.admit && !f.preemption && o_.exclude_after > 0 &&
        node_history_.record(o_.node_rank, f.detected_at)) {
      if (server_ != nullptr) {
        say("node ", o_.node_rank, " failed ", o_.exclude_after,
            " times but hosts the coordination service: not excluded");
      } else {
        f.exclude = true;
        client_->set(str_cat(prefix_, "excluded/", o_.node_rank), std::to_string(g.number));
      }
    }
    json j = {{"code", f.code},   {"detector", f.detector},
              {"what", f.what},   {"preemption", f.preemption},
              {"admit", f.admit}, {"exclude", f.exclude}};
    if (f.node) j["node"] = *f.node;
    if (f.rank) j["rank"] = *f.rank;
    if (f.last_step) j["last_step"] = *f.last_step;
    client_->set(key(g, "failure"), j.dump());
  } catch (const Error& e) {
    say("cannot report the failure to the other nodes: ", e.what());
  }
  return true;
}

std::optional<Failure> Agent::remote_failure(const Generation& g) {
  const std::vector<std::string> k = {key(g, "failure")};
  if (!client_->check(k)) return std::nullopt;
  Failure f;
  f.remote = true;
  f.detected_at = Clock::now();
  const json j = json::parse(client_->get(k[0], milliseconds(1000)), nullptr, false);
  if (!j.is_object()) return f;
  f.code = j.value("code", 1);
  f.detector = j.value("detector", std::string(kDetectExit));
  f.what = j.value("what", std::string("failure on another node"));
  f.preemption = j.value("preemption", false);
  f.admit = j.value("admit", false);
  f.exclude = j.value("exclude", false);
  if (j.contains("node")) f.node = j["node"].get<int>();
  if (j.contains("rank")) f.rank = j["rank"].get<int>();
  if (j.contains("last_step")) f.last_step = j["last_step"].get<int64_t>();
  return f;
}

void Agent::track_recovery(const Generation& g,
                           const std::map<std::string, std::string>& progress) {
  if (!recovery_ || recovery_->generation != g.number) return;
  Recovery& r = *recovery_;
  if (!r.resumed_recorded) {
    const auto resumed = client_->get_prefix(str_cat("resumed/", g.number, "/"));
    for (const auto& [k, v] : resumed) {
      if (const auto s = parse_int(v)) r.resumed_step = std::min(r.resumed_step.value_or(*s), *s);
    }
    if (r.resumed_step) {
      for (const auto& [k, v] : client_->get_prefix(str_cat("resumed_from/", g.number, "/"))) {
        r.checkpoint = v;
      }
      r.resumed_recorded = true;
      FaultEvent e = event(kEventResumed, g.number);
      e.resumed_step = r.resumed_step;
      e.checkpoint = r.checkpoint;
      e.last_step = r.failure.last_step;
      // Known only when the last progress report came after the backup (reports are
      // rate-limited, so they can trail it).
      if (r.failure.last_step && *r.failure.last_step >= *r.resumed_step)
        e.lost_steps = *r.failure.last_step - *r.resumed_step;
      e.message = str_cat("workers resumed", r.checkpoint.empty() ? "" : " from " + r.checkpoint,
                          " at step ", *r.resumed_step);
      recorder_->record(e);
    }
  }
  // The first step completed after the restart: past the resumed step (or any step at all when
  // the workers do not say where they resumed).
  std::optional<int64_t> newest;
  for (const auto& [k, v] : progress) {
    if (const auto s = parse_int(v)) newest = std::max(newest.value_or(*s), *s);
  }
  if (!newest || (r.resumed_step && *newest <= *r.resumed_step)) return;
  const double recovery = seconds_between(r.failure.detected_at, Clock::now());
  FaultEvent e = event(kEventRecovered, g.number);
  e.rank = r.failure.rank;
  e.node = r.failure.node;
  e.detector = r.failure.detector;
  e.last_step = r.failure.last_step;
  e.resumed_step = r.resumed_step;
  e.checkpoint = r.checkpoint;
  e.recovery_seconds = recovery;
  e.restarts = restarts_;
  std::string lost;
  if (r.failure.last_step && r.resumed_step && *r.failure.last_step >= *r.resumed_step) {
    e.lost_steps = *r.failure.last_step - *r.resumed_step;
    e.lost_seconds = recovery + static_cast<double>(*e.lost_steps) * r.step_seconds.value_or(0);
    lost = str_cat("; lost ", *e.lost_steps, " steps, ", fixed(*e.lost_seconds), " s");
  } else if (r.failure.last_step && r.resumed_step) {
    // The last progress report (rate-limited) predates the backup the workers resumed from, so
    // how far past it the failed worker got is not known here: at most one backup interval.
    e.lost_seconds = recovery;
    lost = str_cat("; lost the steps after ", *r.resumed_step,
                   " (at most one backup interval; last progress report: step ",
                   *r.failure.last_step, "), ", fixed(recovery), " s");
  } else {
    lost = str_cat("; back to training ", fixed(recovery), " s after the failure");
  }
  e.message = str_cat(
      r.failure.what, "; restarted",
      r.resumed_step ? str_cat("; resumed", r.checkpoint.empty() ? "" : " from " + r.checkpoint,
                               " at step ", *r.resumed_step)
                     : std::string(),
      lost);
  recorder_->record(e);
  recovery_.reset();
}

// Reads progress and heartbeats; calls `fail` for a hung or silent worker, a lost node, or an
// elastic node waiting to join.
void Agent::monitor(const Generation& g, std::vector<Worker>& workers,
                    const std::function<void(Failure)>& fail) {
  const auto now = Clock::now();
  const auto progress = client_->get_prefix(str_cat("progress/", g.number, "/"));
  for (const auto& [k, v] : progress) {
    const auto s = parse_int(v);
    if (!s) continue;
    job_step_ = std::max(job_step_.value_or(*s), *s);
    if (!first_progress_) first_progress_ = {{*s, now}};
    const auto rank = parse_int(k.substr(k.rfind('/') + 1));
    for (auto& w : workers) {
      if (rank && w.rank == *rank && w.step != s) {
        w.step = s;
        w.step_changed = now;
      }
    }
  }
  track_recovery(g, progress);

  std::map<std::string, milliseconds> ages;
  if (o_.heartbeat_timeout_s > 0) ages = client_->heartbeat_ages();
  // When one worker hangs, the others soon wait for it in a collective and stall too. Look at
  // the likeliest culprit first: a stopped process (SIGSTOP, a debugger), then the worker
  // furthest behind, then the one that stalled first.
  std::vector<Worker*> order;
  for (auto& w : workers) {
    if (w.running) order.push_back(&w);
  }
  std::stable_sort(order.begin(), order.end(), [](const Worker* a, const Worker* b) {
    const bool sa = process_stopped(a->pid), sb = process_stopped(b->pid);
    if (sa != sb) return sa;
    if (a->step && b->step && *a->step != *b->step) return *a->step < *b->step;
    return a->step_changed < b->step_changed;
  });
  for (Worker* wp : order) {
    Worker& w = *wp;
    Failure f;
    f.rank = w.rank;
    f.slot = w.slot;
    f.node = o_.node_rank;
    f.pid = w.pid;
    f.last_step = w.step;
    f.ours = true;
    f.detected_at = now;
    const std::string at_step = w.step ? str_cat(" at step ", *w.step) : std::string();
    const auto age = ages.find(worker_heartbeat_task(g.number, w.rank));
    if (o_.watchdog_timeout_s > 0 && w.step &&
        seconds_between(w.step_changed, now) > o_.watchdog_timeout_s) {
      f.detector = kDetectWatchdog;
      f.detection_latency = seconds_between(w.step_changed, now);
      f.what = str_cat("worker ", w.rank, " made no progress for ", fixed(*f.detection_latency),
                       " s", at_step, " (watchdog)");
    } else if (age != ages.end() && age->second > ms_of(o_.heartbeat_timeout_s)) {
      f.detector = kDetectHeartbeat;
      f.detection_latency = std::chrono::duration<double>(age->second).count();
      f.what = str_cat("worker ", w.rank, " sent no heartbeat for ", fixed(*f.detection_latency),
                       " s", at_step);
    } else {
      continue;
    }
    f.detected_unix = unix_now();
    say(f.what, "; it is hung: collecting its stacks, then killing it");
    f.stack = describe_stuck_process(w.pid, ms_of(o_.stack_timeout_s));
    say("rank ", w.rank, " was doing this:\n", f.stack);
    ::kill(-w.pid, SIGKILL);
    f.code = 128 + SIGKILL;
    fail(std::move(f));
    return;
  }
  if (!multi_node()) return;
  // Other nodes: lost (their launcher's heartbeats stopped), or waiting to join.
  for (int node : g.nodes) {
    if (node == o_.node_rank || o_.heartbeat_timeout_s <= 0) continue;
    const auto age = ages.find(str_cat("node/", node));
    if (age == ages.end() || age->second <= ms_of(o_.heartbeat_timeout_s)) continue;
    Failure f;
    f.node = node;
    f.detector = kDetectHeartbeat;
    f.detected_at = now;
    f.last_step = job_step_;
    f.detection_latency = std::chrono::duration<double>(age->second).count();
    f.what = str_cat("node ", node, " sent no heartbeat for ", fixed(*f.detection_latency), " s");
    fail(std::move(f));
    return;
  }
  if (o_.min_nodes < o_.max_nodes && static_cast<int>(g.nodes.size()) < o_.max_nodes) {
    const dist::Membership m = client_->membership();
    if (!m.joining.empty()) {
      Failure f;
      f.admit = true;
      f.detector = "";
      f.detected_at = now;
      f.last_step = job_step_;
      f.code = 0;
      f.what = str_cat(m.joining.front(), " is waiting to join (", g.nodes.size(), " of at most ",
                       o_.max_nodes, " nodes running)");
      fail(std::move(f));
    }
  }
}

Outcome Agent::supervise(const Generation& g, std::vector<Worker>& workers) {
  const auto grace = ms_of(o_.grace_period_s);
  std::optional<Failure> failure;  // what ends this generation
  std::optional<Clock::time_point> kill_at;
  std::optional<Clock::time_point> drain_until;
  Clock::time_point next_monitor = Clock::now() + kMonitorPeriod;
  bool locally_done = false;  // every worker here exited with 0 (multi-node: wait for the rest)
  bool completed = false;
  const auto stop_all = [&](int sig) {
    for (auto& w : workers) {
      if (w.running) ::kill(-w.pid, sig);
    }
    if (!kill_at) kill_at = Clock::now() + grace;
  };
  // The generation's first failure (here, or learned from another node).
  const auto fail = [&](Failure f) {
    if (failure) return;
    if (f.detected_at == Clock::time_point{}) f.detected_at = Clock::now();
    if (f.detected_unix == 0) f.detected_unix = unix_now();
    if (!f.last_step) f.last_step = job_step_;
    if (!f.remote && !publish(g, f)) {
      // Another node's failure came first: this one is a consequence of it.
      FaultEvent e = event(kEventPeerFailure, g.number, f);
      e.message = f.what + " after a failure on another node";
      recorder_->record(e);
      std::optional<Failure> first;
      try {
        first = remote_failure(g);
      } catch (const Error& e) {
        say("cannot read the other node's failure: ", e.what());
      }
      f = first ? *first : f;
      f.remote = true;
      f.ours = false;
    }
    if (!f.remote) {
      FaultEvent e = event(f.admit        ? kEventAdmit
                           : f.preemption ? kEventPreempted
                                          : kEventFailure,
                           g.number, f);
      if (f.admit) e.exit_code = std::nullopt;  // a node asking to join did not exit
      e.detection_latency_seconds = f.detection_latency;
      e.stack = f.stack;
      e.message = f.what;
      e.time = f.detected_unix;
      recorder_->record(e);
    }
    const std::string who =
        f.rank && f.pid ? str_cat("rank ", *f.rank, " (pid ", *f.pid, "): ") : std::string();
    if (f.remote) {
      say("failure on another node (", f.what, ", code ", f.code, "); stopping the workers");
    } else if (f.admit) {
      say(f.what, "; stopping the workers to re-form the group");
    } else {
      say("failure: ", who, f.what,
          f.preemption ? "; preempted: stopping the other workers (no restart)"
                       : "; stopping the other workers");
    }
    failure = std::move(f);
    stop_all(SIGTERM);
  };

  while (true) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Stream*, const Worker*>> streams;
    fds.push_back({.fd = signals_->fd(), .events = POLLIN, .revents = 0});
    for (auto& w : workers) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd >= 0) {
          fds.push_back({.fd = s->fd, .events = POLLIN, .revents = 0});
          streams.emplace_back(s, &w);
        }
      }
    }
    const bool any_running =
        std::any_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; });
    if (!any_running) {
      const bool waiting_for_nodes = locally_done && !completed && !failure && !received_signal_;
      if (!waiting_for_nodes) {
        if (streams.empty()) break;
        if (!drain_until) drain_until = Clock::now() + milliseconds(1000);
        if (Clock::now() >= *drain_until) break;  // a leftover grandchild holds a pipe
      }
    }
    ::poll(fds.data(), fds.size(), 50);
    for (size_t i = 1; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      pump(*streams[i - 1].first, streams[i - 1].second->prefix);
    }

    for (int sig : signals_->take()) {
      say("received ", strsignal(sig), "; forwarding it to the workers");
      received_signal_ = sig;
      if (!failure) {
        Failure f;
        f.code = 128 + sig;
        f.preemption = true;
        f.node = o_.node_rank;
        f.detector = "signal";
        f.what = str_cat("node ", o_.node_rank, " received ", strsignal(sig));
        f.detected_at = Clock::now();
        publish(g, f);
        FaultEvent e = event(kEventSignal, g.number);
        e.node = o_.node_rank;
        e.signal = sig;
        e.last_step = job_step_;
        e.message = str_cat("the launcher received ", strsignal(sig),
                            "; forwarded it to the workers (no restart)");
        recorder_->record(e);
        failure = f;
      }
      for (auto& w : workers) {
        if (w.running) ::kill(-w.pid, sig);
      }
      if (!kill_at) kill_at = Clock::now() + grace;
    }

    // Reap; within one pass, a worker killed by a signal is the likelier first failure than
    // peers that exited on their own with a collective error.
    std::vector<Worker*> reaped;
    for (auto& w : workers) {
      if (!w.running) continue;
      int status = 0;
      if (::waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
      w.running = false;
      w.status = status;
      w.code = exit_code_of(status);
      reaped.push_back(&w);
    }
    if (client_ != nullptr &&
        std::any_of(reaped.begin(), reaped.end(), [](const Worker* w) { return w->code != 0; })) {
      // The newest steps the workers sent (the periodic read may be a monitor period old), so
      // that failure events name where the workers got to.
      try {
        for (const auto& [k, v] : client_->get_prefix(str_cat("progress/", g.number, "/"))) {
          const auto s = parse_int(v);
          const auto rank = parse_int(k.substr(k.rfind('/') + 1));
          if (!s || !rank) continue;
          for (Worker* w : reaped) {
            if (w->rank == *rank && (!w->step || *w->step < *s)) w->step = s;
          }
        }
      } catch (const Error&) {
        // Best effort: the service may be gone with the failure.
      }
    }
    const auto priority = [&](const Worker* w) {
      if (w->code == 0) return 3;
      if (w->code == kUnavailableCode || w->code == kDeadlineCode) return 2;
      if (WIFSIGNALED(w->status) && WTERMSIG(w->status) != SIGTERM) return 0;
      return 1;
    };
    std::stable_sort(reaped.begin(), reaped.end(),
                     [&](const Worker* a, const Worker* b) { return priority(a) < priority(b); });
    for (Worker* w : reaped) {
      const std::string at_step = w->step ? str_cat(" at step ", *w->step) : std::string();
      if (w->code == 0) continue;
      if (!failure) {
        Failure f;
        f.rank = w->rank;
        f.slot = w->slot;
        f.node = o_.node_rank;
        f.pid = w->pid;
        f.code = w->code;
        if (WIFSIGNALED(w->status)) f.signal = WTERMSIG(w->status);
        f.last_step = w->step;
        f.ours = true;
        f.detected_at = Clock::now();
        f.preemption = w->code == o_.preemption_exit_code;
        f.detector = (w->code == kUnavailableCode || w->code == kDeadlineCode) ? kDetectCollective
                                                                               : kDetectExit;
        f.what = str_cat("worker ", w->rank, " ", describe_exit(w->status), at_step,
                         f.detector == kDetectCollective ? " (a collective failed)" : "");
        fail(std::move(f));
        continue;
      }
      if (w->rank == failure->rank && failure->ours) continue;  // the hung worker we killed
      const bool peer =
          w->code == kUnavailableCode || w->code == kDeadlineCode ||
          (WIFEXITED(w->status) && w->code != o_.preemption_exit_code && w->code != 128 + SIGTERM);
      FaultEvent e = event(peer ? kEventPeerFailure : kEventStopped, g.number);
      e.rank = w->rank;
      e.node = o_.node_rank;
      e.slot = w->slot;
      e.pid = w->pid;
      e.exit_code = w->code;
      if (WIFSIGNALED(w->status)) e.signal = WTERMSIG(w->status);
      if (peer)
        e.detector = w->code == kUnavailableCode || w->code == kDeadlineCode ? kDetectCollective
                                                                             : kDetectExit;
      e.cause_rank = failure->rank;
      e.last_step = w->step;
      e.message = str_cat("worker ", w->rank, " ", describe_exit(w->status), at_step,
                          peer ? " after the failure (a consequence of it)" : " (stopped)");
      recorder_->record(e);
    }
    if (!failure && !locally_done &&
        std::none_of(workers.begin(), workers.end(), [](const Worker& w) { return w.running; })) {
      locally_done = true;
      if (!multi_node() || client_ == nullptr) {
        completed = true;
      } else {
        try {
          client_->set(key(g, str_cat("done/", o_.node_rank)), "0");
        } catch (const Error& e) {
          say("cannot tell the other nodes that this node finished: ", e.what());
        }
      }
    }

    if (client_ != nullptr && !failure && !completed && Clock::now() >= next_monitor) {
      next_monitor = Clock::now() + kMonitorPeriod;
      try {
        if (multi_node()) {
          if (auto remote = remote_failure(g)) fail(*remote);
        }
        if (!failure && !locally_done) monitor(g, workers, fail);
        if (!failure && locally_done && multi_node()) {
          std::vector<std::string> done;
          for (int node : g.nodes) done.push_back(key(g, str_cat("done/", node)));
          if (client_->check(done)) completed = true;
        }
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kUnavailable || e.code() == ErrorCode::kDeadlineExceeded) {
          // The service did not answer: this node is cut off (or node 0 is gone). It cannot
          // tell the others; they see its heartbeats stop.
          lost_service_ = true;
          Failure f;
          f.lost_service = true;
          f.node = o_.node_rank;
          f.detector = kDetectHeartbeat;
          f.detected_at = Clock::now();
          f.last_step = job_step_;
          f.code = kUnavailableCode;
          f.what =
              str_cat("node ", o_.node_rank, " lost the coordination service (", e.what(), ")");
          if (locally_done) {
            // Finished here; the service going away is the job ending elsewhere.
            completed = true;
          } else {
            FaultEvent ev = event(kEventFailure, g.number);
            ev.node = o_.node_rank;
            ev.detector = f.detector;
            ev.exit_code = f.code;
            ev.last_step = f.last_step;
            ev.message = f.what;
            recorder_->record(ev);
            failure = f;
            say(f.what, "; stopping the workers");
            stop_all(SIGTERM);
          }
        } else {
          say("monitoring: ", e.what());
        }
      }
    }

    if (kill_at && Clock::now() >= *kill_at) {
      for (auto& w : workers) {
        if (w.running) {
          say("rank ", w.rank, " (pid ", w.pid,
              ") still running after the grace period; killing it");
          ::kill(-w.pid, SIGKILL);
        }
      }
      kill_at = Clock::now() + std::chrono::hours(24);  // once
    }
  }
  for (auto& w : workers) {
    for (Stream* s : {&w.out, &w.err}) {
      if (s->fd >= 0) {  // a process of the worker's group outlived it and holds the pipe
        close_stream(*s, w.prefix);
        ::kill(-w.pid, SIGKILL);
      }
    }
  }
  if (received_signal_ != 0) {
    int code = 0;
    for (const auto& w : workers) {
      if (w.code != 0 && code == 0) code = w.code;
    }
    if (failure && failure->detector != "signal" && failure->code != 0) code = failure->code;
    return {
        .end = End::kSignal, .code = code != 0 ? code : 128 + received_signal_, .failure = failure};
  }
  if (failure) return {.end = End::kFailure, .code = failure->code, .failure = failure};
  return {.end = End::kCompleted, .code = 0, .failure = std::nullopt};
}

// The end of this node's part of the job, with exit code `code`. Several nodes: tells the others
// this node is leaving; the node hosting the service waits (up to 10 s) for the other members
// of the last generation to say the same, so none of them loses the service before it learned
// the outcome. Returns `code`.
int Agent::finish(const Generation& g, int code) {
  recorder_->flush();
  if (!multi_node() || client_ == nullptr) return code;
  try {
    client_->set(key(g, str_cat("exit/", o_.node_rank)), std::to_string(code));
    if (server_ != nullptr) {
      std::vector<std::string> acks;
      for (int node : g.nodes) acks.push_back(key(g, str_cat("exit/", node)));
      client_->wait(acks, std::chrono::seconds(10));
    }
  } catch (const Error& e) {
    say("while finishing: ", e.what());
  }
  return code;
}

int Agent::run() {
  DTRAIN_CHECK(o_.nproc_per_node >= 1, "launch: --nproc-per-node must be >= 1, got ",
               o_.nproc_per_node);
  DTRAIN_CHECK(o_.min_nodes >= 1 && o_.min_nodes <= o_.max_nodes,
               "launch: --nnodes must be N or MIN:MAX with 1 <= MIN <= MAX");
  DTRAIN_CHECK(o_.node_rank >= 0 && o_.node_rank < o_.max_nodes, "launch: --node-rank ",
               o_.node_rank, " is not in [0, ", o_.max_nodes, ")");
  DTRAIN_CHECK(!o_.command.empty(),
               "launch: no program to run (dtrain launch ... -- PROGRAM ARGS)");
  DTRAIN_CHECK(o_.rdzv != "coordinator" || o_.max_nodes == 1, "launch: with --nnodes ",
               o_.max_nodes,
               ", --rdzv must be host:port of node 0 (where it hosts the coordination service), "
               "file:///shared/dir or redis://host:port");
  DTRAIN_CHECK(o_.rdzv_timeout_s > 0 && o_.grace_period_s >= 0,
               "launch: --rdzv-timeout must be > 0 and --grace-period >= 0");
  DTRAIN_CHECK(o_.max_restarts >= 0, "launch: --max-restarts must be >= 0, got ", o_.max_restarts);
  DTRAIN_CHECK(o_.heartbeat_interval_s >= 0 && o_.heartbeat_timeout_s >= 0 &&
                   o_.watchdog_timeout_s >= 0 && o_.stack_timeout_s >= 0 &&
                   o_.exclude_window_s >= 0 && o_.rdzv_settle_s >= 0,
               "launch: timeouts and intervals must be >= 0");
  DTRAIN_CHECK(o_.exclude_after >= 0, "launch: --exclude-after must be >= 0");
  const bool store_url = o_.rdzv.find("://") != std::string::npos;
  DTRAIN_CHECK(!(store_url && multi_node() && (o_.max_restarts > 0 || o_.min_nodes < o_.max_nodes)),
               "launch: restarts and elastic jobs over several nodes need the coordination "
               "service (--rdzv host:port), not ",
               o_.rdzv);
  if (!store_url && o_.rdzv != "coordinator") {
    dist::parse_host_port(o_.rdzv, "launch: --rdzv");  // a usage error before anything else
  }
  slot_history_ = FailureHistory(o_.exclude_after, ms_of(o_.exclude_window_s));
  node_history_ = FailureHistory(o_.exclude_after, ms_of(o_.exclude_window_s));
  prefix_ = str_cat("dtrain/", o_.run_id, "/launch/");
  recorder_ = std::make_unique<FaultRecorder>(
      FaultRecorderOptions{.event_log = o_.event_log,
                           .logdir = o_.logdir.empty() ? std::string() : o_.logdir + "/launcher"});
  start_service();
  signals_ = std::make_unique<SignalRelay>();

  std::optional<Generation> previous;
  while (true) {
    Generation g;
    try {
      g = form_generation();
    } catch (const FailedPreconditionError& e) {
      FaultEvent ev = event(kEventGiveUp, previous ? previous->number : 0);
      ev.message = e.what();
      recorder_->record(ev);
      say(e.what());
      return recovery_ ? recovery_->failure.code : 1;
    }
    job_step_.reset();
    first_progress_.reset();
    FaultEvent start = event(previous ? kEventRestart : kEventStart, g.number);
    start.world_size = g.world_size;
    start.node = o_.node_rank;
    start.restarts = restarts_;
    start.message =
        previous ? str_cat("restarted the workers in generation ", g.number, " (", g.world_size,
                           " workers, restart ", restarts_, " of ", o_.max_restarts, ")")
                 : str_cat("started ", g.slots.size(), " workers of ", g.world_size,
                           " in generation ", g.number);
    if (recovery_) recovery_->generation = g.number;
    if (previous) say(start.message);
    recorder_->record(start);

    std::vector<Worker> workers;
    spawn_group(g, workers);
    const Outcome out = supervise(g, workers);
    previous = g;

    if (out.end == End::kCompleted) {
      FaultEvent e = event(kEventCompleted, g.number);
      e.restarts = restarts_;
      e.last_step = job_step_;
      e.message = str_cat("every worker finished (", restarts_, " restart(s))");
      recorder_->record(e);
      return finish(g, 0);
    }
    if (out.end == End::kSignal) return finish(g, out.code);
    const Failure& f = *out.failure;
    if (f.preemption) {
      say("preempted (exit code ", f.code, "): not restarting");
      return finish(g, f.code);
    }
    if (f.lost_service && o_.max_restarts == 0) {
      throw UnavailableError(str_cat("launch: lost the coordination service at ", service_));
    }
    if (!f.admit && restarts_ >= o_.max_restarts) {
      FaultEvent e = event(kEventGiveUp, g.number);
      e.rank = f.rank;
      e.node = f.node;
      e.exit_code = f.code;
      e.restarts = restarts_;
      e.last_step = f.last_step;
      e.message = o_.max_restarts == 0
                      ? str_cat(f.what, "; no restarts (--max-restarts 0)")
                      : str_cat(f.what, "; giving up after ", restarts_, " restart(s)");
      recorder_->record(e);
      if (o_.max_restarts > 0) say(e.message);
      return finish(g, f.code);
    }
    // Exclusion: a slot (single node) or node (several) that keeps failing sits out.
    if (f.ours && !f.admit && !multi_node() && f.slot &&
        slot_history_.record(*f.slot, f.detected_at)) {
      excluded_slots_.insert(*f.slot);
      FaultEvent e = event(kEventExclude, g.number);
      e.slot = f.slot;
      e.rank = f.rank;
      e.node = o_.node_rank;
      e.message =
          str_cat("slot ", *f.slot, " failed ", o_.exclude_after, " times within ",
                  o_.exclude_window_s, " s: excluded (",
                  o_.nproc_per_node - static_cast<int>(excluded_slots_.size()), " slot(s) left)");
      recorder_->record(e);
      say(e.message);
      if (static_cast<int>(excluded_slots_.size()) == o_.nproc_per_node) {
        FaultEvent gu = event(kEventGiveUp, g.number);
        gu.exit_code = f.code;
        gu.message = "every slot is excluded";
        recorder_->record(gu);
        return f.code;
      }
    }
    if (f.exclude && f.node && *f.node == o_.node_rank) {
      FaultEvent e = event(kEventExclude, g.number);
      e.node = o_.node_rank;
      e.exit_code = f.code;
      e.message = str_cat("node ", o_.node_rank, " failed ", o_.exclude_after, " times within ",
                          o_.exclude_window_s, " s: excluded from the job");
      recorder_->record(e);
      say(e.message);
      return finish(g, f.code);
    }
    if (!f.admit) ++restarts_;
    if (!f.admit) {
      Recovery r;
      r.failure = f;
      if (first_progress_ && job_step_ && *job_step_ > first_progress_->first) {
        r.step_seconds = seconds_between(first_progress_->second, f.detected_at) /
                         static_cast<double>(*job_step_ - first_progress_->first);
      }
      recovery_ = r;
    }
    say(f.admit
            ? "re-forming the group to admit the waiting node(s)"
            : str_cat("restarting the workers (restart ", restarts_, " of ", o_.max_restarts, ")"));
  }
}

}  // namespace

int run_launch_agent(const LaunchOptions& options) {
  Agent agent(options);
  return agent.run();
}

}  // namespace dtrain::fault
