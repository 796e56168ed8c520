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
#include <type_traits>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/tensor.h"

namespace dtrain::optim {
class Optimizer;
}

namespace dtrain::distribute {

enum class ReduceOp { kSum, kMean };

class OverlappedGradientReduction;
class ShardedOptimizerUpdate;

// One value per local replica, indexed by local replica (tf.distribute's PerReplica).
using PerReplica = std::vector<Tensor>;

class Strategy {
 public:
  virtual ~Strategy() = default;

  // "OneDeviceStrategy", "MirroredStrategy", "MultiWorkerMirroredStrategy".
  virtual std::string name() const = 0;
  // Replicas computed by this process (threads), and in the whole job.
  virtual int num_local_replicas() const = 0;
  // Virtual for MultiWorkerOptions::logical_replicas (a fixed count over any number of workers).
  virtual int num_replicas_in_sync() const { return num_local_replicas() * num_workers(); }
  // This process's index among the workers, and how many worker processes take part.
  virtual int worker_rank() const { return 0; }
  virtual int num_workers() const { return 1; }
  // The chief writes checkpoints and summaries (TF: the chief task, else worker 0).
  virtual bool is_chief() const { return worker_rank() == 0; }
  // Global index of local replica `local`.
  virtual int replica_id(int local) const { return worker_rank() * num_local_replicas() + local; }
  // The fixed number of logical replicas whose gradients are summed in an order that does not
  // depend on the number of workers (MultiWorkerOptions::logical_replicas); 0 when off.
  virtual int logical_replicas() const { return 0; }

  // Calls fn(local_replica) for every local replica, concurrently on the replica threads, and
  // waits for all of them; rethrows the first exception.
  virtual void run(const std::function<void(int local_replica)>& fn) = 0;
  // strategy.run(fn) for a fn that returns a value: calls fn(local_replica) on every local
  // replica as above and returns their results, indexed by local replica.
  template <class F>
  requires std::is_same_v<std::invoke_result_t<F&, int>, Tensor> PerReplica run(F&& fn) {
    PerReplica out(num_local_replicas());
    run(std::function<void(int)>([&](int r) { out[r] = fn(r); }));
    return out;
  }

  // strategy.reduce(op, value): the element-wise sum of the local replicas' values (added in
  // replica order 0, 1, ..., so the result does not depend on thread timing), then across
  // workers; kMean divides by num_replicas_in_sync(). Returns a new tensor, identical on every
  // worker. Throws InvalidArgumentError when the values differ in shape or dtype or their count
  // is not num_local_replicas(); blocks and throws like all_reduce_across_workers.
  Tensor reduce(ReduceOp op, const PerReplica& values);
  // The training step's gradient reduction, the one place it is written (fit's replicated
  // step uses it): out[v] = sum over local replicas r, in replica order, of per_replica[r][v],
  // then all-reduced across workers (bucketed) together with options.extra; kMean divides the
  // gradients (not extra) by num_replicas_in_sync(). The local sum is split over the replica
  // threads by element ranges (optim::Optimizer::element_range); options.then, when set, runs
  // on every replica thread after the reduction — in the same pass as the local sum when there
  // is one worker — and may touch only its own element range of each gradient, as
  // Optimizer::update_part does. A replica with an empty list (it had no rows) and an undefined
  // gradient contribute nothing; a variable that no replica has a gradient for gets zeros.
  // `out` must hold defined float tensors of the variables' shapes; it may alias
  // per_replica[0] (the sum is then written in place). Allocates nothing in steady state.
  // Throws InvalidArgumentError when the lists disagree in length, shape or dtype; blocks and
  // throws like all_reduce_across_workers.
  struct ReduceGradientsOptions {
    std::span<Tensor> extra = {};  // reduced (summed) in the same collective, e.g. a stop flag
    const std::function<void(int local_replica, int num_local_replicas)>* then = nullptr;
  };
  virtual void reduce_gradients(std::span<const std::vector<Tensor>> per_replica,
                                std::span<Tensor> out, ReduceOp op,
                                const ReduceGradientsOptions& options);
  void reduce_gradients(std::span<const std::vector<Tensor>> per_replica, std::span<Tensor> out,
                        ReduceOp op) {
    reduce_gradients(per_replica, out, op, ReduceGradientsOptions{});
  }

  // The gradient all-reduce overlapped with backward (gradient_overlap.h), for the step that
  // would call reduce_gradients(per_replica, out, kSum, {.extra = extra}) with one local
  // replica; bitwise the same sums. Null when this strategy does not overlap (the default; see
  // MultiWorkerOptions::overlap_gradients), or with one worker or several local replicas.
  virtual std::unique_ptr<OverlappedGradientReduction> make_overlapped_reduction(
      std::span<Tensor> out, std::span<Tensor> extra);

  // Sharded optimizer state (sharded_update.h) for fit's replicated step with one local replica:
  // null when this strategy does not shard it (the default; see
  // MultiWorkerOptions::shard_optimizer_state).
  virtual std::unique_ptr<ShardedOptimizerUpdate> make_sharded_update(
      std::span<Variable* const> vars, std::span<Tensor> extra, optim::Optimizer& optimizer);

  // Reduces `tensors` element-wise across worker processes, in place; the same bits arrive on
  // every worker. A no-op with one worker. Blocks; throws UnavailableError when a peer is lost
  // and DeadlineExceededError after the collective timeout.
  virtual void all_reduce_across_workers(std::span<Tensor> tensors, ReduceOp op) = 0;
  // Overwrites `tensors` on every worker with the chief's values, in place.
  virtual void broadcast_from_chief(std::span<Tensor> tensors) = 0;
  // Reduces one number across workers (metric totals, counts).
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  // out[w] = worker w's `local`; `out` has shape [num_workers(), local.shape...]. For checks
  // such as verify_sync (sync_check.h). Blocks and throws like all_reduce_across_workers.
  virtual void all_gather_across_workers(const Tensor& local, Tensor& out);
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

  // The tutorial's report_tensorboard=true: when not empty, fit() under this strategy writes
  // TensorBoard event files (scalars, and text entries for recoveries) under this directory,
  // on the chief only. Set through the strategies' options.
  const std::string& tensorboard_logdir() const { return tensorboard_logdir_; }

 protected:
  std::string tensorboard_logdir_;

 private:
  std::vector<Tensor> reduce_list_;  // reduce_gradients' out + extra, reused every step
};

// The strategy of the innermost live scope on this thread, or null (single replica). Replica
// threads see the strategy that runs them.
Strategy* current_strategy();
// The local replica the calling thread is running inside Strategy::run, or -1 outside run.
int current_local_replica();

}  // namespace dtrain::distribute
