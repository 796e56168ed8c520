// The public Dataset and Iterator API: argument checks, node construction (the nodes live in
// the dataset_*.cc files, see dataset_node.h) and resuming a pass from an IteratorState.
#include "dtrain/data/dataset.h"

#include <utility>

#include "dataset_node.h"
#include "dtrain/core/random.h"

namespace dtrain::data {

// ---- Iterator --------------------------------------------------------------------------------

Iterator::Iterator(std::unique_ptr<detail::IteratorNode> impl, int64_t iteration)
    : impl_(std::move(impl)), iteration_(iteration) {}
Iterator::Iterator(Iterator&&) noexcept = default;
Iterator& Iterator::operator=(Iterator&&) noexcept = default;
Iterator::~Iterator() = default;

bool Iterator::next(Element& out) {
  if (error_) std::rethrow_exception(error_);
  DTRAIN_CHECK(impl_ != nullptr, "Iterator::next: iterator was moved from");
  try {
    if (!impl_->next(out)) return false;
  } catch (...) {
    error_ = std::current_exception();
    throw;
  }
  ++position_;
  return true;
}

// ---- Dataset ---------------------------------------------------------------------------------

namespace {
void check_defined(const Dataset& ds, const char* op) {
  if (!ds.defined()) {
    throw FailedPreconditionError(str_cat("Dataset::", op, ": the dataset is undefined"));
  }
}
}  // namespace

Dataset Dataset::from_tensor_slices(std::vector<Tensor> components) {
  DTRAIN_CHECK(!components.empty(), "Dataset::from_tensor_slices: no components");
  for (size_t c = 0; c < components.size(); ++c) {
    DTRAIN_CHECK(components[c].defined(), "Dataset::from_tensor_slices: component ", c,
                 " is undefined");
    DTRAIN_CHECK(components[c].rank() >= 1, "Dataset::from_tensor_slices: component ", c,
                 " is a scalar; slicing needs rank >= 1");
    DTRAIN_CHECK(components[c].dim(0) == components[0].dim(0),
                 "Dataset::from_tensor_slices: all components must have the same first "
                 "dimension, but component 0 has shape ",
                 components[0].shape().to_string(), " and component ", c, " has shape ",
                 components[c].shape().to_string());
  }
  return Dataset(detail::make_slices_node(std::move(components)));
}

Dataset Dataset::map(MapFn fn) const {
  check_defined(*this, "map");
  DTRAIN_CHECK(fn != nullptr, "Dataset::map: empty function");
  return Dataset(detail::make_map_node(node_, std::move(fn)));
}

Dataset Dataset::shuffle(int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration) const {
  check_defined(*this, "shuffle");
  DTRAIN_CHECK(buffer_size >= 1, "Dataset::shuffle: buffer_size must be >= 1, got ", buffer_size);
  const uint64_t s = seed.has_value() ? *seed : next_seed();
  return Dataset(detail::make_shuffle_node(node_, buffer_size, s, reshuffle_each_iteration));
}

Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  check_defined(*this, "batch");
  DTRAIN_CHECK(batch_size >= 1, "Dataset::batch: batch_size must be >= 1, got ", batch_size);
  return Dataset(detail::make_batch_node(node_, batch_size, drop_remainder));
}

Dataset Dataset::repeat(int64_t count) const {
  check_defined(*this, "repeat");
  DTRAIN_CHECK(count >= -1, "Dataset::repeat: count must be >= -1, got ", count);
  return Dataset(detail::make_repeat_node(node_, count));
}

Dataset Dataset::take(int64_t count) const {
  check_defined(*this, "take");
  DTRAIN_CHECK(count >= -1, "Dataset::take: count must be >= -1, got ", count);
  return Dataset(detail::make_take_node(node_, count));
}

Dataset Dataset::skip(int64_t count) const {
  check_defined(*this, "skip");
  DTRAIN_CHECK(count >= -1, "Dataset::skip: count must be >= -1, got ", count);
  return Dataset(detail::make_skip_node(node_, count));
}

Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  check_defined(*this, "shard");
  DTRAIN_CHECK(num_shards >= 1, "Dataset::shard: num_shards must be >= 1, got ", num_shards);
  DTRAIN_CHECK(0 <= index && index < num_shards, "Dataset::shard: index ", index,
               " out of range for ", num_shards, " shards");
  return Dataset(detail::make_shard_node(node_, num_shards, index));
}

Dataset Dataset::prefetch(int64_t buffer_size) const {
  check_defined(*this, "prefetch");
  DTRAIN_CHECK(buffer_size >= 1 || buffer_size == kAutotune,
               "Dataset::prefetch: buffer_size must be >= 1 or kAutotune, got ", buffer_size);
  return Dataset(detail::make_prefetch_node(
      node_, buffer_size == kAutotune ? kAutotunePrefetch : buffer_size));
}

int64_t Dataset::cardinality() const {
  check_defined(*this, "cardinality");
  return node_->cardinality();
}

Iterator Dataset::iterator(int64_t iteration) const {
  check_defined(*this, "iterator");
  DTRAIN_CHECK(iteration >= 0, "Dataset::iterator: iteration must be >= 0, got ", iteration);
  return Iterator(node_->make_iterator(static_cast<uint64_t>(iteration)), iteration);
}

Iterator Dataset::iterator_from(const IteratorState& state) const {
  DTRAIN_CHECK(state.position >= 0, "Dataset::iterator_from: negative position ", state.position);
  Iterator it = iterator(state.iteration);
  const int64_t skipped = it.impl_->skip(state.position);
  DTRAIN_CHECK(skipped == state.position, "Dataset::iterator_from: pass ", state.iteration,
               " has only ", skipped, " elements, cannot resume at position ", state.position);
  it.position_ = state.position;
  return it;
}

}  // namespace dtrain::data
