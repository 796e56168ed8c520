// The Keras mask a model's output carries (Keras's `y_pred._keras_mask`), which fit() and
// evaluate() pass to the loss and the metrics so that they weight by it: a timestep-wise output
// after Embedding(mask_zero=true) (or a hand-made mask) counts only its unmasked steps.
#pragma once

#include <utility>

#include "dtrain/core/tensor.h"

namespace dtrain::nn {

class Model;

// model(x, training) and its output's mask: for Sequential and Functional (one output) the mask
// that reaches the output (Layer::compute_mask along the way; float32 0/1, [batch, time]), and
// undefined when none does or for other models (subclassed models pass masks themselves).
// Thread-safe as model(x, training) is: the mask is recorded per calling thread.
std::pair<Tensor, Tensor> call_with_output_mask(Model& model, const Tensor& x, bool training);

}  // namespace dtrain::nn
