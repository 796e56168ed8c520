// Private to the train layer: the replicated step's part of nn/state_updates.h. After the
// replicas' forward passes, gather() sums each stateful layer's pending updates over the local
// replicas in replica order into one buffer; the step sums that buffer across workers with its
// gradient all-reduce (ReduceGradientsOptions::extra); apply() divides by the replicas in sync
// and applies the mean to every layer, so every replica and worker ends with the same bits.
// This matches TF's ON_READ/MEAN moving statistics: each replica's copy is updated with its
// own batch, and what is read, checkpointed and used for inference is their mean, which the
// update's linearity makes equal to one update with the mean of the replicas' updates.
// Under logical replicas (Strategy::logical_replicas) gather() itself collects every logical
// replica's update from every worker (distribute::ReplicaGather) and sums them in logical order,
// so the moving statistics do not depend on the number of workers (bitwise those of
// MirroredStrategy(L) in one process); the caller then does not all-reduce the buffer.
#pragma once

#include <memory>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/replica_all_reduce.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/state_updates.h"

namespace dtrain::train {

class StateUpdates {
 public:
  StateUpdates() = default;
  StateUpdates(const StateUpdates&) = delete;
  StateUpdates& operator=(const StateUpdates&) = delete;
  // Disconnects the synchronized BatchNormalization layers from the strategy.
  ~StateUpdates();
  // With the model built: finds its stateful layers, sizes the buffer, and connects the
  // synchronized BatchNormalization layers to `strategy`'s replica collective.
  void begin(nn::Model& model, distribute::Strategy& strategy);
  bool empty() const { return layers_.empty(); }
  // Whether the caller sums buffer() across workers (with its gradients): not when empty, nor
  // under logical replicas (gather sums every worker's updates).
  bool needs_all_reduce() const { return !layers_.empty() && !gather_; }
  // The summed updates (valid after gather; reduced in place across workers by the caller
  // when needs_all_reduce()).
  Tensor& buffer() { return sum_; }
  // Sums the pending updates of local replicas 0..local-1, in that order; under logical
  // replicas those of every logical replica 0..L-1 of every worker, in that order.
  void gather(int local);
  // Applies buffer() / replicas_in_sync to every layer.
  void apply(int replicas_in_sync);

 private:
  std::vector<nn::StatefulLayer*> layers_;
  std::vector<int64_t> offsets_;
  Tensor sum_;
  std::vector<float> one_;  // one replica's update of one layer
  // Logical replicas only: the gather, this worker's replicas' updates [local, total] and every
  // logical replica's [L, total].
  std::unique_ptr<distribute::ReplicaGather> gather_;
  Tensor local_rows_, all_rows_;
  std::vector<nn::BatchNormalization*> synced_;
  std::shared_ptr<distribute::ReplicaAllReduce> all_reduce_;
};

}  // namespace dtrain::train
