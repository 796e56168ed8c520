// A collective that a Strategy's local replica threads call together from inside
// Strategy::run (tf.distribute's ReplicaContext.all_reduce), for ops that need the global
// batch within a step (SyncBatchNormalization's moments). Each replica passes its values; the
// sum over the local replicas in replica order, then across workers, is written back to every
// replica, so every replica of every worker gets the same bits. Every replica must make the
// same calls with the same sizes; a replica that does not arrive within `timeout` makes the
// others throw DeadlineExceededError (a replica failed before the collective) rather than
// hang. Thread-safe across the replica threads of one run().
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {

class ReplicaAllReduce {
 public:
  explicit ReplicaAllReduce(Strategy& strategy,
                            std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // On replica thread current_local_replica(): values ← Σ over every replica of values.
  // Outside run() (no replica) with one replica in sync: only the cross-worker sum.
  void all_reduce_sum(std::span<double> values);

 private:
  Strategy& st_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  // A float64 buffer of n values (one per size in use: no allocation in steady state).
  Tensor& buffer(size_t n);

  std::vector<std::span<double>> slots_;
  bool failed_ = false;
  std::deque<Tensor> buffers_;
};

}  // namespace dtrain::distribute
