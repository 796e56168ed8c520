// Embedding lookup kernels (gathering rows of a table) without autograd; see
// dtrain/autograd/embedding.h. Thread-safe for distinct outputs.
#pragma once

#include <cstdint>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain::ops {

// table [vocab, dim], ids [...] → [..., dim]: out[p] = table[ids[p]]. Ids may have any integer or
// float dtype; an id outside [0, vocab) (or a float id that is not an integer) throws
// InvalidArgumentError naming `who`, the position (a multi-index) and the id.
Tensor embedding_lookup(const Tensor& table, const Tensor& ids, const std::string& who);

// The gradient of embedding_lookup for the table: a zeroed [vocab, dim] tensor into which row
// g[p] is added at ids[p]. Work is O(vocab·dim) for the zeroing and O(ids·dim) for the rows.
Tensor embedding_gradient(const Tensor& g, const Tensor& ids, int64_t vocab);

}  // namespace dtrain::ops
