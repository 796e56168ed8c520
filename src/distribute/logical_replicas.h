// Private to distribute: the exact reduction over logical replicas behind
// MultiWorkerOptions::logical_replicas. The global batch is split into L fixed logical replicas,
// mapped onto the W workers in contiguous blocks; each worker computes one gradient list per
// logical replica it holds, every worker gathers all L lists, and every element is summed in
// logical order 0, 1, ..., L-1 (the first contribution copied), so the sums do not depend on W
// nor on the mapping: bitwise those of MirroredStrategy(L) in one process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/distribute/collectives.h"

namespace dtrain::distribute {

// The logical replicas [begin, end) that worker `rank` of `workers` computes: contiguous blocks
// in rank order, the first L % W workers one more. Throws InvalidArgumentError when
// `num_logical` < 1 or `workers` > `num_logical`.
std::pair<int, int> logical_block(int num_logical, int workers, int rank);

class LogicalReplicaReduction {
 public:
  explicit LogicalReplicaReduction(int num_logical) : num_logical_(num_logical) {}

  // Collects the gradient lists of all logical replicas: `local[i]` is logical replica
  // block.first + i of this worker (an empty list or an undefined tensor: no gradient).
  // With `collectives` (several workers) every worker's lists are packed and all-gathered;
  // without (one worker), they are read in place. `out` gives the variables' shapes and
  // dtypes. Afterwards sum() may run. Allocates nothing in steady state. Throws
  // InvalidArgumentError when a list disagrees with `out`; blocks and throws like
  // Collectives::all_gather_v.
  void gather(Collectives* collectives, std::span<const std::vector<Tensor>> local,
              std::span<const Tensor> out);

  // out[v][element_range(n, part, parts)] = the sum over logical replicas 0..L-1, in that
  // order, of their gradients (zeros when none has one), times `scale` unless it is 1. Safe
  // to call concurrently for distinct parts. `out` may alias a local gradient only with one
  // worker and one logical replica.
  void sum(std::span<Tensor> out, int part, int parts, double scale) const;

 private:
  int num_logical_;
  std::vector<size_t> offsets_;  // each variable's byte offset in a replica's record
  size_t record_bytes_ = 0;      // presence flags, then every variable, 8-byte aligned
  std::vector<std::byte> send_;  // this worker's records
  std::vector<double> recv_;     // every logical replica's record, in logical order (aligned)
  std::vector<size_t> bytes_per_rank_;
  // sources_[l * V + v]: logical replica l's gradient of variable v, or null.
  std::vector<const void*> sources_;
};

}  // namespace dtrain::distribute
