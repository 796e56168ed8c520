// Private to the train layer: evaluate()'s loop, also run by fit() on validation data.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/data/dataset.h"
#include "dtrain/nn/model.h"
#include "dtrain/train/callbacks.h"

namespace dtrain::train {

// Loss and metrics of `model` over `dataset` (at most `steps` batches), with keys prefixed by
// `prefix` ("val_" for fit's validation). Under a multi-worker strategy each worker evaluates its
// rows of every batch and the totals are summed, so every worker returns the same logs.
nn::Logs run_evaluation(nn::Model& model, const data::Dataset& dataset,
                        std::optional<int64_t> steps, int verbose,
                        const std::vector<std::shared_ptr<Callback>>& callbacks,
                        const std::string& prefix);

}  // namespace dtrain::train
