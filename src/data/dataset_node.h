// Private to src/data: the base classes of the dataset graph and one factory per node kind.
// Each DatasetNode is immutable and shared; each pass builds a fresh chain of IteratorNodes.
// Iterators reuse their containers across elements, so a steady-state pass allocates only when
// it starts. Where each node lives:
//   dataset_source.cc    from_tensor_slices
//   dataset_transform.cc map, batch (element-wise and stacking transformations)
//   dataset_shuffle.cc   shuffle
//   dataset_select.cc    repeat, take, skip, shard (which elements, how often)
//   dataset_prefetch.cc  prefetch (the background producer thread)
//   dataset.cc           the public Dataset/Iterator API: argument checks, resuming from an
//                        IteratorState
#pragma once

#include <cstdint>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "dtrain/core/tensor.h"
#include "dtrain/data/dataset.h"

namespace dtrain::data::detail {

constexpr int64_t kMaxInt64 = std::numeric_limits<int64_t>::max();

class IteratorNode {
 public:
  virtual ~IteratorNode() = default;
  // See Iterator::next. Once it has returned false, later calls return false too.
  virtual bool next(Element& out) = 0;
  // Advances past up to `n` elements without producing them where the node can avoid it;
  // returns the number skipped (less than n only at the end of the pass).
  virtual int64_t skip(int64_t n) {
    int64_t k = 0;
    while (k < n && next(skip_scratch_)) ++k;
    skip_scratch_.clear();
    return k;
  }

  // Fast path for batch(): an iterator whose elements are always rows of fixed tensors (the
  // components of from_tensor_slices, possibly shuffled) returns those tensors here, and then
  // next_index() yields the row index of each element instead of views. Null otherwise.
  virtual const std::vector<Tensor>* row_source() const { return nullptr; }
  // The row of the next element (only when row_source() is not null); false at the end. Mixing
  // next() and next_index() on one iterator walks a single sequence.
  virtual bool next_index(int64_t& /*index*/) { return false; }

 private:
  Element skip_scratch_;
};

class DatasetNode : public std::enable_shared_from_this<DatasetNode> {
 public:
  virtual ~DatasetNode() = default;
  // Pass `pass` of this dataset; `pass` seeds reshuffling (see Dataset::repeat).
  virtual std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const = 0;
  virtual int64_t cardinality() const = 0;

 protected:
  template <class T>
  std::shared_ptr<const T> self() const {
    return std::static_pointer_cast<const T>(shared_from_this());
  }
};

using NodePtr = std::shared_ptr<const DatasetNode>;

// Wraps a node into a Dataset, for sources defined outside dataset.cc (text.cc, ...).
struct DatasetAccess {
  static Dataset wrap(NodePtr node) { return Dataset(std::move(node)); }
};

// Factories, one per node kind; arguments are checked by the Dataset methods that call them.
NodePtr make_slices_node(std::vector<Tensor> components);
NodePtr make_map_node(NodePtr input, Dataset::MapFn fn);
NodePtr make_batch_node(NodePtr input, int64_t batch_size, bool drop_remainder);
NodePtr make_shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle);
NodePtr make_repeat_node(NodePtr input, int64_t count);
NodePtr make_take_node(NodePtr input, int64_t count);
NodePtr make_skip_node(NodePtr input, int64_t count);
NodePtr make_shard_node(NodePtr input, int64_t num_shards, int64_t index);
NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size);

}  // namespace dtrain::data::detail
