// A collective that a Strategy's local replica threads call together from inside
// Strategy::run (tf.distribute's ReplicaContext.all_reduce), for ops that need the global
// batch within a step (SyncBatchNormalization's moments). Each replica passes its values; the
// sum over the local replicas in replica order, then across workers, is written back to every
// replica, so every replica of every worker gets the same bits. Every replica must make the
// same calls with the same sizes; a replica that does not arrive within `timeout` makes the
// others throw DeadlineExceededError (a replica failed before the collective) rather than
// hang. Thread-safe across the replica threads of one run(). Under logical replicas
// (Strategy::logical_replicas) the sum is over the logical replicas in logical order 0..L-1
// (gathered with ReplicaGather), so its bits do not depend on the number of workers: those of
// MirroredStrategy(L) in one process.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {

// Gathers one row per replica from every worker, in global replica order: row i of `out`
// ([num_replicas_in_sync, n]) ← the row of replica i (Strategy::replica_id), taken from row r of
// `local` ([num_local_replicas, n], row r: local replica r) on the worker that runs it. Works for
// uneven blocks of replicas (logical replicas: L % W workers hold one more). Every worker calls
// it together, outside the replica threads; float32 or float64. Blocks and throws like
// Strategy::all_gather_across_workers; InvalidArgumentError when the shapes do not fit.
class ReplicaGather {
 public:
  explicit ReplicaGather(Strategy& strategy) : st_(strategy) {}
  void gather(const Tensor& local, Tensor& out);

 private:
  Strategy& st_;
  Tensor send_, recv_;  // each worker's record: [first replica id, count, rows (padded)]
};

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

  // The sum of the slots' values into `sum` (their length): in replica order, then across
  // workers; under logical replicas gathered and summed in logical order.
  void sum_slots(Tensor& sum);

  std::vector<std::span<double>> slots_;
  bool failed_ = false;
  std::deque<Tensor> buffers_;
  // Logical replicas only: the gather, and per length in use the local replicas' rows and
  // every logical replica's ([local, len] and [L, len]).
  std::unique_ptr<ReplicaGather> gather_;
  struct Rows {
    size_t len;
    Tensor local, all;
  };
  std::deque<Rows> rows_;
};

}  // namespace dtrain::distribute
