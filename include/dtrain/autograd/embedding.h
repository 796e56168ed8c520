// The differentiable embedding lookup (tf.nn.embedding_lookup). Thread-safe for distinct
// tensors.
#pragma once

#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain {

// table [vocab, dim], ids [...] (any integer or float dtype) → [..., dim]. Ids outside
// [0, vocab) throw InvalidArgumentError naming `who`, the position and the id. The gradient
// for the table is dense [vocab, dim] (zeroed once) with only the looked-up rows written: the
// backward does O(ids·dim) work beyond the zeroing. The ids are not differentiated.
Tensor embedding_lookup(const Tensor& table, const Tensor& ids,
                        const std::string& who = "embedding_lookup");

}  // namespace dtrain
