// Synchronization check (--verify-sync N): proves that mirrored variables are bitwise identical
// on every worker by comparing a CRC-32C of each variable across workers. Call it from the
// controlling thread on every worker at the same step; it is a collective.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/distribute/strategy.h"

namespace dtrain::distribute {

// A variable as the check sees it: its name and its value.
struct NamedTensor {
  std::string name;
  Tensor value;
};

// The CRC-32C of a tensor's dtype, shape and bytes.
uint32_t tensor_checksum(const Tensor& t);

// Gathers every worker's checksums of `variables` (in order) and compares them with the chief's.
// Returns normally when all agree. Otherwise every worker throws InternalError naming the first
// diverging variable (in list order), the workers whose copy differs from the chief's, and the
// step when given (>= 0). Also throws InternalError when workers disagree on how many variables
// there are or on their names. Blocks and throws like Strategy::all_gather_across_workers.
void verify_sync(Strategy& strategy, std::span<const NamedTensor> variables, int64_t step = -1);
// The same for Variables (name() and tensor()).
void verify_sync(Strategy& strategy, std::span<Variable* const> variables, int64_t step = -1);

}  // namespace dtrain::distribute
