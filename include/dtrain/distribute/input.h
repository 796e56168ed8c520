// Distributed input, TF's semantics: a dataset yields global batches; each of the
// num_replicas_in_sync() replicas computes on its own slice of every global batch (its
// "per-replica batch"), and the loss is scaled by 1 / global batch. Sharding is by data (TF's
// AutoShardPolicy.DATA): every worker runs the same pipeline with the same seeds and keeps its
// rows, so with one seed, 2 workers x 32 per replica step through exactly the batches one worker
// with a global batch of 64 would. Pure functions and immutable datasets; thread-safe.
#pragma once

#include <cstdint>
#include <utility>

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

}  // namespace dtrain::distribute
