// Private to the train layer: Model::fit under a ParameterServerStrategy scope
// (src/train/fit_parameter_server.cc, docs/parameter-server.md). Not thread-safe.
#pragma once

#include <functional>
#include <optional>

#include "dtrain/train/training.h"

namespace dtrain::train::detail {

// True when `strategy` is a ParameterServerStrategy.
bool is_parameter_server_strategy(const distribute::Strategy* strategy);

// On the chief: registers the model's trainable variables on the parameter servers, schedules
// one closure per step (synchronous mode: one per worker and step) through a
// ClusterCoordinator, checkpoints the servers when options.save_checkpoints, recovers from a
// lost server, evaluates validation data on the chief after pulling the variables, and returns
// the History; the model holds the trained values afterwards. On a worker: serves the chief's
// step closures and returns an empty History when the chief is done. Throws what the strategy
// and coordinator throw (UnavailableError when a server stays lost, InvalidArgumentError for a
// model that differs between tasks).
History fit_parameter_server(
    nn::Model& model, const std::function<data::Dataset(std::optional<uint64_t>)>& make_dataset,
    std::optional<uint64_t> data_seed, const FitOptions& options);

}  // namespace dtrain::train::detail
