// Distributed input, TF's semantics: a dataset yields global batches; each of the
// num_replicas_in_sync() replicas computes on its own slice of every global batch (its
// "per-replica batch"), and the loss is scaled by 1 / global batch. Sharding is by data (TF's
// AutoShardPolicy.DATA): every worker runs the same pipeline with the same seeds and keeps its
// rows, so with one seed, 2 workers x 32 per replica step through exactly the batches one worker
// with a global batch of 64 would. For in-memory data, worker_batches does the same without
// materialising the global batches: each worker shuffles row indices only and gathers just its
// rows. Pure functions and immutable datasets; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/data/dataset.h"
#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {

// Rows [begin, end) of a batch of `batch_rows` rows that global replica `replica` of
// `num_replicas` takes: as even as possible, the first (batch_rows % num_replicas) replicas
// taking one row more (TF's rebatching of a partial last batch). Some replicas get no rows when
// batch_rows < num_replicas.
std::pair<int64_t, int64_t> replica_rows(int64_t batch_rows, int num_replicas, int replica);

// experimental_distribute_dataset: `global_batches` (batched by the global batch size) as this
// worker sees it: each element holds the rows of this worker's local replicas, a zero-copy view
// of the global batch. With one worker the dataset is returned unchanged.
data::Dataset distribute_dataset(const data::Dataset& global_batches, const Strategy& strategy);

// Local replica `local_replica`'s rows of a worker batch (an element of distribute_dataset; with
// one worker, the global batch): a zero-copy view (Tensor::slice). Because replica_rows gives
// the extra rows to the lowest replicas, this equals the replica's slice of the global batch.
// Throws InvalidArgumentError for a scalar batch or a replica out of range.
Tensor replica_slice(const Tensor& worker_batch, const Strategy& strategy, int local_replica);
// The same for each component of an element ({x, y}).
data::Element replica_slice(const data::Element& worker_batch, const Strategy& strategy,
                            int local_replica);

// Rows [begin, end) of a global batch of `batch_rows` that this worker's local replicas take.
std::pair<int64_t, int64_t> worker_rows(int64_t batch_rows, const Strategy& strategy);
// The same for the worker whose replicas are global replicas [first_replica, last_replica].
std::pair<int64_t, int64_t> worker_rows(int64_t batch_rows, int num_replicas, int first_replica,
                                        int last_replica);

// Per-worker input for in-memory data (what fit(x, y) uses under a multi-worker strategy).
struct WorkerBatchesOptions {
  int64_t batch_size = 0;  // the global batch
  bool shuffle = true;     // a full-buffer shuffle, reshuffled each pass (fit(x, y)'s)
  std::optional<uint64_t> seed =
      std::nullopt;  // the shuffle's seed: every worker must pass the same
};

// The worker's part of from_tensor_slices(components).shuffle(n, seed).batch(batch_size), where
// n is the number of rows: pass i, element j holds exactly the rows worker_rows gives this worker
// of that dataset's pass i, element j — bitwise the same bytes — followed by one more component,
// an int64 scalar holding that global batch's row count (for the loss scale and the replica
// split). Only row indices are shuffled and batched for the global batch; the worker gathers
// its own rows, so the cost per worker falls with the number of workers. Cardinality, passes
// and IteratorState positions (global batches) are those of the global dataset, so a checkpoint
// of the position resumes exactly with any number of workers. Throws InvalidArgumentError as
// from_tensor_slices does, or for a batch size below 1.
data::Dataset worker_batches(std::vector<Tensor> components, const WorkerBatchesOptions& options,
                             const Strategy& strategy);
// The same for the worker holding global replicas [first_replica, last_replica] of
// `num_replicas`.
data::Dataset worker_batches(std::vector<Tensor> components, const WorkerBatchesOptions& options,
                             int num_replicas, int first_replica, int last_replica);

}  // namespace dtrain::distribute
