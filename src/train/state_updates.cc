// StateUpdates: pending layer-state updates of the replicas, combined after the step.
#include "state_updates.h"

#include <algorithm>
#include <span>

namespace dtrain::train {

StateUpdates::~StateUpdates() {
  for (nn::BatchNormalization* bn : synced_) bn->set_sync(nullptr);
}

void StateUpdates::begin(nn::Model& model, distribute::Strategy& strategy) {
  layers_ = nn::stateful_layers(model);
  for (nn::BatchNormalization* bn : synced_) bn->set_sync(nullptr);
  synced_.clear();
  for (nn::StatefulLayer* l : layers_) {
    auto* bn = dynamic_cast<nn::BatchNormalization*>(l);
    if (bn == nullptr || !bn->options().synchronized) continue;
    if (!all_reduce_) all_reduce_ = std::make_shared<distribute::ReplicaAllReduce>(strategy);
    bn->set_sync(std::make_shared<BatchNormSync>(BatchNormSync{
        .all_reduce_sum = [r = all_reduce_](std::span<double> v) { r->all_reduce_sum(v); }}));
    synced_.push_back(bn);
  }
  offsets_.clear();
  int64_t total = 0, largest = 0;
  for (nn::StatefulLayer* l : layers_) {
    offsets_.push_back(total);
    total += l->pending_update_size();
    largest = std::max(largest, l->pending_update_size());
  }
  sum_ = layers_.empty() ? Tensor() : Tensor(Shape{total});
  one_.assign(static_cast<size_t>(largest), 0.0f);
  gather_.reset();
  if (!layers_.empty() && strategy.logical_replicas() > 0) {
    gather_ = std::make_unique<distribute::ReplicaGather>(strategy);
    local_rows_ = Tensor(Shape{strategy.num_local_replicas(), total});
    all_rows_ = Tensor(Shape{strategy.num_replicas_in_sync(), total});
  }
}

void StateUpdates::gather(int local) {
  if (layers_.empty()) return;
  float* s = sum_.data<float>();
  std::fill_n(s, sum_.num_elements(), 0.0f);
  if (gather_) {
    // Each local replica's updates in its row, every logical replica's gathered, then summed
    // in logical order exactly as the loop below sums one process's replicas.
    const int64_t total = sum_.num_elements();
    float* mine = local_rows_.data<float>();
    for (int r = 0; r < local; ++r) {
      for (size_t i = 0; i < layers_.size(); ++i) {
        layers_[i]->take_pending_update(
            r, std::span<float>(mine + r * total + offsets_[i],
                                static_cast<size_t>(layers_[i]->pending_update_size())));
      }
    }
    gather_->gather(local_rows_, all_rows_);
    const float* all = all_rows_.data<float>();
    for (int64_t l = 0, n = all_rows_.dim(0); l < n; ++l) {
      for (int64_t j = 0; j < total; ++j) s[j] += all[l * total + j];
    }
    return;
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int64_t n = layers_[i]->pending_update_size();
    float* dst = s + offsets_[i];
    for (int r = 0; r < local; ++r) {
      layers_[i]->take_pending_update(r, std::span<float>(one_.data(), static_cast<size_t>(n)));
      for (int64_t j = 0; j < n; ++j) dst[j] += one_[static_cast<size_t>(j)];
    }
  }
}

void StateUpdates::apply(int replicas_in_sync) {
  if (layers_.empty()) return;
  float* s = sum_.data<float>();
  const auto count = static_cast<float>(replicas_in_sync);
  for (int64_t j = 0, n = sum_.num_elements(); j < n; ++j) s[j] /= count;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->apply_update(std::span<const float>(
        s + offsets_[i], static_cast<size_t>(layers_[i]->pending_update_size())));
  }
}

}  // namespace dtrain::train
