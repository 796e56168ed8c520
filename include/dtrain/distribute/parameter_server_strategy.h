// ParameterServerStrategy and ClusterCoordinator (tf.distribute.experimental.
// ParameterServerStrategy, tf.distribute.experimental.coordinator.ClusterCoordinator) for C++.
// A job is a TF_CONFIG cluster with one "chief", N "worker" and M "ps" tasks. The ps tasks run
// ParameterServer (`dtrain ps`). Every worker runs the same program as the chief: it registers
// named step functions and serve()s; the chief's ClusterCoordinator schedule()s closures (a
// function name and integer arguments — C++ has no tf.function to ship) onto whichever worker
// is free. A step function pull()s the variables from the servers, computes gradients on its
// data and push()es them; the servers apply the optimizer (their slots live there).
//
//   // chief                                          // every worker
//   ParameterServerStrategy strategy;                 ParameterServerStrategy strategy;
//   strategy.create_variables(vars, opt_config);      strategy.attach_variables(vars);
//   ClusterCoordinator coordinator(strategy);         strategy.register_function("step", fn);
//   coordinator.schedule("step", {epoch, i});         strategy.serve();
//   coordinator.join();  coordinator.shutdown_workers();
//
// Model::fit does all of this under a ParameterServerStrategy scope (docs/parameter-server.md).
// Failures: a worker that dies has its closures run elsewhere and is used again once it answers;
// a lost server makes the closures fail and join() throw UnavailableError naming it, after which
// recover() / recover_latest() restore every server from a checkpoint (save() records the epoch
// and step it was taken at, so the chief knows where to continue). Thread-safety: the
// strategy's pull/push/save/restore may be called from any thread; ClusterCoordinator is
// thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "dtrain/distribute/cluster_resolver.h"
#include "dtrain/distribute/parameter_server.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::distribute {

struct ParameterServerStrategyOptions {
  std::optional<ClusterSpec> cluster = std::nullopt;  // default: resolve_cluster()
  VariablePartitioner partitioner = {};               // default: whole variables
  // false: every push is applied at once (TF's default). true: each step is split into
  // num_parts parts whose gradients a server sums (in part order) before one update.
  bool synchronous = false;
  // Deadline of one pull, push, save or restore call.
  std::chrono::milliseconds rpc_timeout = std::chrono::seconds(30);
  // How long create_variables waits for every server to answer, and recover / recover_latest
  // for every server to be back and hold the restored state.
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(30);
  // A call to a server whose connection was lost first waits up to this long for gRPC to
  // reconnect (its reconnect backoff is at most 500 ms), so that the first pull after a server
  // came back does not fail; a server that stays away fails the call after this wait.
  std::chrono::milliseconds reconnect_grace = std::chrono::seconds(2);
  // A worker's serve() returns (DeadlineExceededError) when no closure or probe came from the
  // chief for this long, so an orphaned worker does not live forever. 0: wait forever.
  std::chrono::milliseconds worker_idle_timeout = std::chrono::minutes(5);
};

// What a pull saw: the version of every server, checked by the push that follows.
struct PullToken {
  std::vector<int64_t> versions;       // per server
  std::vector<uint64_t> incarnations;  // per server
};

struct PushOptions {
  // Identifies the closure; a second push with the same id is ignored. -1: the id of the
  // closure this thread runs (inside a step function), else none (no duplicate detection).
  int64_t closure_id = -1;
  // Synchronous mode: this is part `part` of `num_parts` of step `step`.
  int64_t step = 0;
  int part = 0;
  int num_parts = 1;
};

struct PushResult {
  int64_t staleness = 0;  // largest over the servers: updates applied since the pull
  double pull_ms = 0;     // unused by push; filled by callers that time their pull
  double push_ms = 0;     // wall time of the push
};

// Where training stood when a checkpoint was taken: save() records it in the checkpoint (int64
// scalars "dtrain/epoch" and "dtrain/step_in_epoch"), restore_latest() reports it.
struct TrainingPosition {
  int64_t epoch = 0;  // the epoch to continue with (0-based, as fit's initial_epoch)
  int64_t step = 0;   // steps of that epoch already applied
};

// A checkpoint of the servers found (and restored) by restore_latest() / recover_latest().
struct ParameterServerCheckpoint {
  std::string prefix;         // "<dir>/<name>", without ".index"
  TrainingPosition position;  // as given to save()
};

// A worker's step function: integer arguments in, numbers out (losses, metric totals).
using ClosureFunction = std::function<std::vector<double>(std::span<const int64_t> args)>;

class ParameterServerStrategy final : public Strategy {
 public:
  // Resolves the cluster (options.cluster or resolve_cluster()). Throws InvalidArgumentError
  // when it has no "ps" job, no "worker" job, no "chief", or when this task is a "ps" or
  // "evaluator" (a ps task runs ParameterServer / `dtrain ps`). Does not connect yet.
  explicit ParameterServerStrategy(const ParameterServerStrategyOptions& options = {});
  ~ParameterServerStrategy() override;

  std::string name() const override { return "ParameterServerStrategy"; }
  // Each process computes alone: one local replica and, for the collective API that the other
  // strategies share, a world of one (nothing is all-reduced; the servers combine gradients).
  int num_local_replicas() const override { return 1; }
  bool is_chief() const override { return cluster_.task_type == "chief"; }
  using Strategy::run;
  void run(const std::function<void(int)>& fn) override { fn(0); }
  void all_reduce_across_workers(std::span<Tensor>, ReduceOp) override {}
  void broadcast_from_chief(std::span<Tensor>) override {}
  double all_reduce_scalar(double value, ReduceOp) override { return value; }
  void barrier() override {}

  const ClusterSpec& cluster() const { return cluster_; }
  bool synchronous() const { return options_.synchronous; }
  int num_ps() const { return static_cast<int>(ps_addresses_.size()); }
  // Worker tasks (the chief computes no steps).
  int num_worker_tasks() const { return static_cast<int>(worker_addresses_.size()); }
  const std::vector<std::string>& ps_addresses() const { return ps_addresses_; }
  const std::vector<std::string>& worker_addresses() const { return worker_addresses_; }

  // Chief: places `vars`, waits for every server (up to connect_timeout) and registers its
  // share of the variables with their current values and an optimizer built from `optimizer`
  // (its slots are created on the servers). Replaces what the servers held. Throws
  // UnavailableError naming a server that does not answer, InvalidArgumentError for
  // unsupported variables (non-float32) or optimizer configs.
  void create_variables(std::span<Variable* const> vars, const optim::OptimizerConfig& optimizer);
  // Worker: places `vars` as the chief did, without contacting anyone.
  void attach_variables(std::span<Variable* const> vars);
  const std::vector<VariablePlacement>& placement() const { return placement_; }

  // Copies the servers' current values into `vars` (the variables given to create_variables /
  // attach_variables, in the same order). One call per server. Throws UnavailableError naming
  // host:port when a server is lost or has restarted without variables, DeadlineExceededError
  // after rpc_timeout, InvalidArgumentError naming a variable whose shape differs from the
  // server's, FailedPreconditionError on a protocol or model-signature mismatch.
  PullToken pull(std::span<Variable* const> vars);
  // Sends `grads` (one per variable, same order, undefined = none) to the servers, which apply
  // them (async) or accumulate them for the step (sync). Throws like pull().
  PushResult push(const PullToken& token, std::span<const Tensor> grads,
                  const PushOptions& options = {});

  // Every server writes its shard (`<prefix>_temp/part-<ps>`: its variables, the optimizer's
  // slots for them, and on server 0 the iteration count), the chief writes `position`, then the
  // shards are merged into one TensorFlow checkpoint `<prefix>.index` +
  // `<prefix>.data-0000i-of-0000N` (N = servers + 1; keys are variable names, slots
  // "<Optimizer>/<slot>/<variable>" as Optimizer names its slot variables, e.g. "Adam/m/dense/
  // kernel", "iteration", "dtrain/epoch", "dtrain/step_in_epoch"), and `<dir>/checkpoint` is
  // updated to name it. The caller must not push meanwhile. Throws UnavailableError for a lost
  // server, file errors naming the path.
  void save(const std::string& prefix, const TrainingPosition& position = {});
  // Every server reads its variables, slots and iteration count back from the checkpoint at
  // `prefix`. Throws NotFoundError, DataLossError, UnavailableError.
  void restore(const std::string& prefix);
  // Chief, after create_variables or recover: restores every server from the newest valid
  // checkpoint save() wrote into `dir` — the largest recorded (epoch, step), ties to the newer
  // index file — and returns it with its position; std::nullopt (servers untouched) when `dir`
  // does not exist or holds none. Valid: the index and every tensor's CRC check out and every
  // variable shard and optimizer slot of this model is there with its shape; the `checkpoint`
  // state file is not consulted. Invalid ones are skipped with a warning on stderr naming them.
  // Throws UnavailableError for a lost server, DataLossError when restores were attempted and
  // none succeeded (the servers may then hold a mix), FailedPreconditionError before
  // create_variables.
  std::optional<ParameterServerCheckpoint> restore_latest(const std::string& dir);
  // After a server failure: waits until every server answers, registers the variables again
  // (values of `vars` as they are now) and, when `prefix` is not empty, restores every server
  // from it; then checks that every server is initialized and is the process that was
  // registered. A server that is still restarting, restarts again meanwhile, or whose
  // connection is not back yet is retried (backoff 50 ms to 1 s) until connect_timeout has
  // passed; when this returns, pulls from any process see the restored state. Throws
  // UnavailableError naming the server and the last error when the servers do not all come
  // back in time, and NotFoundError / DataLossError from the restore without retrying.
  void recover(std::span<Variable* const> vars, const std::string& prefix);
  // recover() from the newest valid checkpoint in `dir` (restore_latest), retried the same way;
  // returns it, or std::nullopt when `dir` holds none (the servers then hold `vars`).
  std::optional<ParameterServerCheckpoint> recover_latest(std::span<Variable* const> vars,
                                                          const std::string& dir);
  // Statistics of every server (Status RPC); throws UnavailableError for a lost one.
  std::vector<ParameterServerStats> server_stats();

  // Worker: makes `fn` callable by the chief under `name`.
  void register_function(const std::string& name, ClosureFunction fn);
  // Worker: serves the functions at this task's cluster address until the chief calls
  // ClusterCoordinator::shutdown_workers() (returns) or nothing arrives for
  // worker_idle_timeout (throws DeadlineExceededError). Throws UnavailableError when it cannot
  // listen on its address, FailedPreconditionError on the chief.
  void serve();
  // Inside a step function: the id of the closure this thread runs (-1 outside).
  static int64_t current_closure_id();

 private:
  friend class ClusterCoordinator;
  struct Impl;
  // Waits (until `deadline`) for every server to answer, then registers the variables and the
  // optimizer; returns every server's incarnation.
  std::vector<uint64_t> register_variables(std::span<Variable* const> vars,
                                           std::chrono::steady_clock::time_point deadline);
  // Runs `attempt` (register, restore, confirm) until it succeeds or connect_timeout passes,
  // retrying UnavailableError and DeadlineExceededError.
  void with_recovery_retries(
      const char* what, const std::function<void(std::chrono::steady_clock::time_point)>& attempt);
  // Throws UnavailableError unless every server is initialized with the given incarnation.
  void confirm_registered(const std::vector<uint64_t>& incarnations);
  ClusterSpec cluster_;
  ParameterServerStrategyOptions options_;
  std::vector<std::string> ps_addresses_;
  std::vector<std::string> worker_addresses_;
  std::vector<VariablePlacement> placement_;
  std::unique_ptr<Impl> impl_;
};

// A closure's result, like tf's RemoteValue.
class RemoteValue {
 public:
  // Blocks until the closure ran; returns its results, or throws its error (a lost server:
  // UnavailableError; the coordinator was destroyed first: CancelledError as UnavailableError).
  std::vector<double> fetch() const;
  bool ready() const;

 private:
  friend class ClusterCoordinator;
  struct State;
  std::shared_ptr<State> state_;
};

struct ClusterCoordinatorOptions {
  // Deadline of one closure on a worker; a worker that overruns it counts as lost.
  std::chrono::milliseconds closure_timeout = std::chrono::minutes(2);
  // How often a lost worker is probed to see whether it came back.
  std::chrono::milliseconds probe_interval = std::chrono::milliseconds(200);
  // join() throws UnavailableError when no worker has been reachable for this long while
  // closures wait.
  std::chrono::milliseconds no_worker_timeout = std::chrono::minutes(2);
};

struct CoordinatorStats {
  int64_t scheduled = 0;
  int64_t completed = 0;
  int64_t reassigned = 0;  // closures re-run on another worker after theirs was lost
  int64_t worker_failures = 0;
  std::vector<int64_t> per_worker;  // closures completed by each worker task
};

class ClusterCoordinator {
 public:
  // Chief only (FailedPreconditionError elsewhere). Starts one dispatcher thread per worker task.
  explicit ClusterCoordinator(ParameterServerStrategy& strategy,
                              const ClusterCoordinatorOptions& options = {});
  // Fails the closures still queued, stops the dispatchers (waits for in-flight closures, at
  // most closure_timeout).
  ~ClusterCoordinator();
  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  // Queues `function(args)` for the next free worker and returns at once. Throws the pending
  // server failure (UnavailableError) if one was seen and not yet cleared by reset_error().
  RemoteValue schedule(const std::string& function, std::vector<int64_t> args);
  // Blocks until every scheduled closure has finished. Throws the first error of a closure
  // since the last join (UnavailableError naming the server for a lost server, the function's
  // own error otherwise; queued closures are cancelled then), and UnavailableError when no
  // worker answered for no_worker_timeout.
  void join();
  // True when nothing is queued or running.
  bool done();
  // After a server failure was handled (strategy.recover): accept closures again.
  void reset_error();
  // Tells every reachable worker's serve() to return. Best effort, bounded by a second each.
  void shutdown_workers();
  CoordinatorStats stats();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dtrain::distribute
