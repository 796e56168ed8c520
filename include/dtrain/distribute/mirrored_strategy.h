// MirroredStrategy: N replicas as threads in one process (tf.distribute.MirroredStrategy with
// CPU "devices"), and OneDeviceStrategy, the single-replica default. In one process the
// replicas share one copy of each variable: every replica reads it during the step and the
// update is applied once, after the fixed-order reduction, so the copies TF would mirror are
// identical by construction. Used from one controlling thread; run() fans out to the replica
// threads, which persist for the strategy's lifetime.
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {

struct MirroredOptions {
  // OpenBLAS threads while the strategy lives: 0 = max(1, cores / replicas) so replica threads
  // and BLAS threads do not fight over cores; -1 = leave the setting alone; n > 0 = n.
  // The previous setting is restored when the strategy is destroyed.
  int blas_threads = 0;
  // Write TensorBoard event files from fit() (chief only) under `logdir`.
  bool report_tensorboard = false;
  std::string logdir = "logs";
};

class MirroredStrategy : public Strategy {
 public:
  // `num_replicas` replicas (0: one per hardware thread). Replica 0 runs on the thread that
  // calls run(); replicas 1.. get their own threads, started here. Throws InvalidArgumentError
  // for a negative count.
  explicit MirroredStrategy(int num_replicas = 0, const MirroredOptions& options = {});
  ~MirroredStrategy() override;
  MirroredStrategy(const MirroredStrategy&) = delete;
  MirroredStrategy& operator=(const MirroredStrategy&) = delete;

  std::string name() const override { return "MirroredStrategy"; }
  int num_local_replicas() const override { return num_replicas_; }

  using Strategy::run;
  // Calls fn(r) for every replica r concurrently, each on its own thread (so replicas may wait
  // for each other inside fn), and waits for all. Rethrows the exception of the lowest-numbered
  // replica that threw. Throws FailedPreconditionError when called from inside run().
  void run(const std::function<void(int local_replica)>& fn) override;

  // One process: nothing to exchange between workers.
  void all_reduce_across_workers(std::span<Tensor>, ReduceOp) override {}
  void broadcast_from_chief(std::span<Tensor>) override {}
  double all_reduce_scalar(double value, ReduceOp) override { return value; }
  void barrier() override {}

 private:
  void replica_loop(int replica);

  int num_replicas_;
  int previous_blas_threads_ = -1;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  // A step is published by bumping generation_ and waited for through pending_. Both are atomic
  // so that replica threads and the controlling thread can spin on them for a few microseconds
  // before sleeping on the condition variables (a futex wake-up costs more than a short step).
  // They are written under mu_, so a sleeper never misses a change.
  std::atomic<const std::function<void(int)>*> fn_{nullptr};
  int stream_base_ = -1;  // the global id of local replica 0 when several replicas are in sync
                          // (published with fn_), else -1
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  bool running_ = false;                    // controlling thread only
  std::vector<std::exception_ptr> errors_;  // one per replica
};

// One replica on the calling thread, one worker: the strategy fit uses when none is given.
class OneDeviceStrategy final : public Strategy {
 public:
  std::string name() const override { return "OneDeviceStrategy"; }
  int num_local_replicas() const override { return 1; }
  using Strategy::run;
  void run(const std::function<void(int local_replica)>& fn) override;
  void all_reduce_across_workers(std::span<Tensor>, ReduceOp) override {}
  void broadcast_from_chief(std::span<Tensor>) override {}
  double all_reduce_scalar(double value, ReduceOp) override { return value; }
  void barrier() override {}
};

}  // namespace dtrain::distribute
