// Trackable: what a checkpoint can track, as a tagged reference.
#include "dtrain/core/error.h"
#include "graph_view.h"

namespace dtrain::checkpoint {

Trackable::Trackable(nn::Layer& layer) : Trackable(Kind::kLayer, &layer) {}
Trackable::Trackable(optim::Optimizer& optimizer) : Trackable(Kind::kOptimizer, &optimizer) {}
Trackable::Trackable(Variable& variable) : Trackable(Kind::kVariable, &variable) {}
Trackable::Trackable(int64_t& counter) : Trackable(Kind::kCounter, &counter) {}
Trackable::Trackable(RngState& state) : Trackable(Kind::kRngState, &state) {}
Trackable::Trackable(Philox& rng) : Trackable(Kind::kPhilox, &rng) {}
Trackable::Trackable(data::IteratorState& state) : Trackable(Kind::kIteratorState, &state) {}

Trackable Trackable::iterator(const data::Dataset& dataset, data::Iterator& iterator) {
  Trackable t(Kind::kIterator, &iterator);
  auto extra = std::make_shared<detail::TrackableExtra>();
  extra->dataset = &dataset;
  t.extra_ = std::move(extra);
  return t;
}

Trackable Trackable::value(std::function<Tensor()> get, std::function<void(const Tensor&)> set) {
  DTRAIN_CHECK(get && set, "Trackable::value: both get and set are required");
  Trackable t(Kind::kValue, nullptr);
  auto extra = std::make_shared<detail::TrackableExtra>();
  extra->get = std::move(get);
  extra->set = std::move(set);
  t.extra_ = std::move(extra);
  return t;
}

Trackable Trackable::object(std::vector<std::pair<std::string, Trackable>> children) {
  Trackable t(Kind::kObject, nullptr);
  auto extra = std::make_shared<detail::TrackableExtra>();
  extra->children = std::move(children);
  t.extra_ = std::move(extra);
  return t;
}

const void* Trackable::identity() const {
  return (kind_ == Kind::kValue || kind_ == Kind::kObject) ? extra_.get() : ptr_;
}

}  // namespace dtrain::checkpoint
