// Distribution strategies, like tf.distribute: how many replicas compute a step, how their
// gradients are combined, and how variables stay identical ("mirrored") everywhere.
//
//   distribute::MirroredStrategy strategy(2);        // 2 replicas as threads in this process
//   auto scope = strategy.scope();                   // models compiled in scope use it
//   nn::Sequential model(...);  model.compile(...);  model.fit(...);
//
// Semantics follow TF: the global batch is split across replicas; each replica's loss is scaled
// by 1/global_batch; gradients are summed across replicas; every replica applies the same
// update, so variables stay bitwise identical. A Strategy is used from one controlling thread;
// run() calls its function concurrently on the local replica threads.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::distribute {

enum class ReduceOp { kSum, kMean };

class Strategy {
 public:
  virtual ~Strategy() = default;

  // "OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy".
  virtual std::string name() const = 0;
  // Replicas computed by this process (threads), and in the whole job.
  virtual int num_local_replicas() const = 0;
  int num_replicas_in_sync() const { return num_local_replicas() * num_workers(); }
  // This process's index among the workers, and how many worker processes take part.
  virtual int worker_rank() const { return 0; }
  virtual int num_workers() const { return 1; }
  // The chief writes checkpoints and summaries (TF: the chief task, else worker 0).
  virtual bool is_chief() const { return worker_rank() == 0; }
  // Global index of local replica `local`.
  int replica_id(int local) const { return worker_rank() * num_local_replicas() + local; }

  // Calls fn(local_replica) for every local replica, concurrently on the replica threads, and
  // waits for all of them; rethrows the first exception.
  virtual void run(const std::function<void(int local_replica)>& fn) = 0;

  // Reduces `tensors` element-wise across worker processes, in place; the same bits arrive on
  // every worker. A no-op with one worker. Blocks; throws UnavailableError when a peer is lost
  // and DeadlineExceededError after the collective timeout.
  virtual void all_reduce_across_workers(std::span<Tensor> tensors, ReduceOp op) = 0;
  // Overwrites `tensors` on every worker with the chief's values, in place.
  virtual void broadcast_from_chief(std::span<Tensor> tensors) = 0;
  // Reduces one number across workers (metric totals, counts).
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  // Waits until every worker has reached this point.
  virtual void barrier() = 0;

  // Makes this the strategy of the calling thread until the guard dies (strategy.scope()).
  class ScopeGuard {
   public:
    explicit ScopeGuard(Strategy* s);
    ~ScopeGuard();
    ScopeGuard(const ScopeGuard&) = delete;
    ScopeGuard& operator=(const ScopeGuard&) = delete;

   private:
    Strategy* previous_;
  };
  [[nodiscard]] ScopeGuard scope() { return ScopeGuard(this); }
};

// The strategy of the innermost live scope on this thread, or null (single replica).
Strategy* current_strategy();

}  // namespace dtrain::distribute
