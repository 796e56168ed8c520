// The built-in residual CNN of `dtrain fit --arch resnet`.
#pragma once

#include <memory>

#include "dtrain/core/shape.h"
#include "dtrain/nn/model.h"

namespace dtrain::cli {

// A small Functional residual network for images `example` ([h, w] get a channel axis, or
// [h, w, c]) and `classes` logits; its BatchNormalization is synchronized under a strategy with
// several synchronous replicas (the strategy in scope when it is called). InvalidArgumentError
// for other example shapes.
std::unique_ptr<nn::Model> make_resnet(const Shape& example, int64_t classes);

}  // namespace dtrain::cli
