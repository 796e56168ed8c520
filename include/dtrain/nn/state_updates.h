// Layer state that training calls update outside of gradients: BatchNormalization's moving
// mean and variance. Keras assigns them inside the forward pass. Under MirroredStrategy the
// replica threads call one shared layer object concurrently, so a training call made on a
// replica thread (core/random.h: current_replica_stream().local >= 0) instead records a
// pending update for its replica, and the training step (src/train/state_updates.h) combines
// the replicas' pending updates — their mean, in replica order, then across workers — and
// applies it once after the step, identically on every worker. Training calls outside
// replicas (one device, custom loops) apply their update at once, as Keras does.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "dtrain/nn/layer.h"

namespace dtrain::nn {

class StatefulLayer {
 public:
  virtual ~StatefulLayer() = default;
  // Floats in one replica's pending update (fixed once the layer is built).
  virtual int64_t pending_update_size() const = 0;
  // Moves local replica `local`'s pending update into `out` (pending_update_size() floats) and
  // clears it; a replica that made no training call gives the identity update. Not concurrent
  // with that replica's training calls.
  virtual void take_pending_update(int local, std::span<float> out) = 0;
  // Applies `update` (the mean of every replica's pending update) to the state variables.
  virtual void apply_update(std::span<const float> update) = 0;
};

// The built StatefulLayer layers of `layer` and of its sub-layers (models, recursively), in
// tracking order.
std::vector<StatefulLayer*> stateful_layers(Layer& layer);

}  // namespace dtrain::nn
