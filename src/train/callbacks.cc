// History, EarlyStopping, TerminateOnNaN.
#include "dtrain/train/callbacks.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "dtrain/train/training.h"
#include "training_state.h"

namespace dtrain::train {

void request_stop_training(nn::Model& model) {
  state_of(model, "request_stop_training").stop_training = true;
}

void History::on_epoch_end(int64_t epoch, const Logs& logs) {
  if (!epochs_.empty() && epoch <= epochs_.back()) {
    // An epoch run again: drop it and what followed, and rebuild (a key may miss in some epochs).
    const auto keep = std::lower_bound(epochs_.begin(), epochs_.end(), epoch) - epochs_.begin();
    epochs_.resize(static_cast<size_t>(keep));
    logs_.resize(static_cast<size_t>(keep));
    history_.clear();
    for (const Logs& l : logs_) {
      for (const auto& [k, v] : l) history_[k].push_back(v);
    }
  }
  epochs_.push_back(epoch);
  logs_.push_back(logs);
  for (const auto& [k, v] : logs) history_[k].push_back(v);
}

double History::last(const std::string& key) const {
  auto it = history_.find(key);
  if (it == history_.end() || it->second.empty()) {
    throw NotFoundError("History: no values recorded for '" + key + "'");
  }
  return it->second.back();
}

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : o_(std::move(options)) {
  DTRAIN_CHECK(o_.mode == "auto" || o_.mode == "min" || o_.mode == "max",
               "EarlyStopping: mode must be auto, min or max, got '", o_.mode, "'");
  maximize_ = o_.mode == "max" ||
              (o_.mode == "auto" && (o_.monitor.find("acc") != std::string::npos ||
                                     o_.monitor.rfind("fmeasure") != std::string::npos ||
                                     o_.monitor.find("auc") != std::string::npos));
}

void EarlyStopping::on_train_begin(const Logs&) {
  wait_ = 0;
  stopped_epoch_ = -1;
  best_ = maximize_ ? -INFINITY : INFINITY;
  if (o_.baseline) best_ = *o_.baseline;
  best_weights_.clear();
}

bool EarlyStopping::improved(double current, double reference) const {
  return maximize_ ? current - o_.min_delta > reference : current + o_.min_delta < reference;
}

void EarlyStopping::on_epoch_end(int64_t epoch, const Logs& logs) {
  auto it = logs.find(o_.monitor);
  if (it == logs.end()) {
    std::cerr << "EarlyStopping: metric '" << o_.monitor << "' is not in the logs; available: ";
    for (const auto& [k, v] : logs) std::cerr << k << " ";
    std::cerr << "\n";
    return;
  }
  if (epoch < o_.start_from_epoch) return;
  const double current = it->second;
  ++wait_;
  if (improved(current, best_)) {
    best_ = current;
    wait_ = 0;
    if (o_.restore_best_weights) {
      best_weights_.clear();
      for (Variable* v : model()->weights()) best_weights_.push_back(v->tensor().clone());
    }
    return;
  }
  if (wait_ >= o_.patience && epoch > 0) {
    stopped_epoch_ = epoch;
    request_stop_training(*model());
    if (o_.restore_best_weights && !best_weights_.empty()) {
      const auto vars = model()->weights();
      for (size_t i = 0; i < vars.size() && i < best_weights_.size(); ++i) {
        vars[i]->assign(best_weights_[i]);
      }
    }
  }
}

std::vector<Tensor> EarlyStopping::state() const {
  Tensor scalars = Tensor::zeros(Shape{4}, DType::kFloat64);
  double* v = scalars.data<double>();
  v[0] = static_cast<double>(wait_);
  v[1] = best_;
  v[2] = static_cast<double>(stopped_epoch_);
  v[3] = best_weights_.empty() ? 0.0 : 1.0;
  std::vector<Tensor> out{scalars};
  if (!o_.restore_best_weights || model() == nullptr) return out;
  const auto vars = model()->weights();
  for (size_t i = 0; i < vars.size(); ++i) {
    out.push_back(i < best_weights_.size() ? best_weights_[i] : vars[i]->tensor());
  }
  return out;
}

void EarlyStopping::set_state(const std::vector<Tensor>& state) {
  DTRAIN_CHECK(
      !state.empty() && state[0].dtype() == DType::kFloat64 && state[0].shape() == Shape{4},
      "EarlyStopping::set_state: expected float64 [4] first, as state() gives");
  const double* v = state[0].data<double>();
  wait_ = static_cast<int64_t>(v[0]);
  best_ = v[1];
  stopped_epoch_ = static_cast<int64_t>(v[2]);
  best_weights_.clear();
  if (v[3] != 0.0 && o_.restore_best_weights) {
    for (size_t i = 1; i < state.size(); ++i) best_weights_.push_back(state[i].clone());
  }
}

void EarlyStopping::on_train_end(const Logs&) {
  if (stopped_epoch_ >= 0) {
    std::cerr << "Epoch " << stopped_epoch_ + 1 << ": early stopping\n";
  }
}

void TerminateOnNaN::on_train_batch_end(int64_t batch, const Logs& logs) {
  auto it = logs.find("loss");
  if (it != logs.end() && !std::isfinite(it->second)) {
    std::cerr << "Batch " << batch << ": Invalid loss, terminating training\n";
    request_stop_training(*model());
  }
}

}  // namespace dtrain::train
