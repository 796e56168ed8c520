// TrainingState's metric helpers, and the accessors of the state a model holds.
#include "training_state.h"

#include "dtrain/core/error.h"

namespace dtrain::train {

std::vector<nn::Metric*> TrainingState::all_metrics() {
  std::vector<nn::Metric*> out{&loss_tracker};
  for (const auto& m : metrics) out.push_back(m.get());
  return out;
}

void TrainingState::reset_metrics() {
  loss_tracker.reset_state();
  for (const auto& m : metrics) m->reset_state();
}

void TrainingState::fill_logs(nn::Logs& logs, const std::string& prefix) {
  logs[prefix + "loss"] = loss_tracker.result();
  for (const auto& m : metrics) logs[prefix + m->name()] = m->result();
}

void TrainingState::all_reduce_metrics() {
  if (strategy == nullptr || strategy->num_workers() == 1) return;
  auto reduce = [&](nn::Metric& m) {
    const auto [total, count] = m.state();
    m.set_state(strategy->all_reduce_scalar(total, distribute::ReduceOp::kSum),
                strategy->all_reduce_scalar(count, distribute::ReduceOp::kSum));
  };
  reduce(loss_tracker);
  for (const auto& m : metrics) reduce(*m);
}

TrainingState* find_state(nn::Model& model) { return TrainingAccess::get(model); }

TrainingState& state_of(nn::Model& model, const char* fn) {
  TrainingState* s = TrainingAccess::get(model);
  if (s == nullptr) {
    throw FailedPreconditionError(
        str_cat(fn, ": model '", model.name(),
                "' must be compiled first: call model.compile({.optimizer = ..., .loss = ...})"));
  }
  return *s;
}

}  // namespace dtrain::train
