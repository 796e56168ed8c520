// Row partitions of a list of variables across N shards: the one layout that sharded optimizer
// state (ZeRO, dtrain/distribute) and sharded checkpoints (TensorBundle slices,
// dtrain/checkpoint) share, so that worker k's optimizer partition is exactly what it writes.
//
// The variables are laid end to end in order (their flat concatenation) and cut only at row
// boundaries (dimension 0), so every part of a variable is a contiguous row range — a
// hyper-rectangle, as TF's TensorSliceProto needs — and every shard's part of the flat
// concatenation is one contiguous element range, as reduce-scatter needs. A row goes to the
// shard its first element falls in when the total is split evenly (shard = start * N / total), so
// shards differ by at most about one row. Scalars count as one row of one element. Shards may be
// empty (more shards than rows). Pure and deterministic: every worker computes the same layout.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/core/shape.h"

namespace dtrain {

// Rows [row_begin, row_end) of variable `variable` (its index in the list), which are elements
// [flat_begin, flat_end) of the flat concatenation.
struct RowSlice {
  int variable = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t flat_begin = 0;
  int64_t flat_end = 0;
};

struct RowPartition {
  int num_shards = 1;
  int64_t total_elements = 0;
  // shards[k]: shard k's slices in variable order; shard_begin[k] .. shard_begin[k + 1] is its
  // flat element range (shard_begin has num_shards + 1 entries).
  std::vector<std::vector<RowSlice>> shards;
  std::vector<int64_t> shard_begin;

  int64_t shard_elements(int k) const { return shard_begin[k + 1] - shard_begin[k]; }
};

// Throws InvalidArgumentError for num_shards < 1.
RowPartition partition_rows(std::span<const Shape> shapes, int num_shards);

}  // namespace dtrain
