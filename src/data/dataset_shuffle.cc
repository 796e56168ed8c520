// shuffle: TF's buffered shuffle, over elements or (for row sources) over row indices.
#include <algorithm>
#include <utility>

#include "dataset_node.h"
#include "dtrain/core/random.h"

namespace dtrain::data::detail {
namespace {

// ---- shuffle ---------------------------------------------------------------------------------

class ShuffleNode final : public DatasetNode {
 public:
  ShuffleNode(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle)
      : input_(std::move(input)), buffer_size_(buffer_size), seed_(seed), reshuffle_(reshuffle) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override { return input_->cardinality(); }

  const NodePtr input_;
  const int64_t buffer_size_;
  const uint64_t seed_;
  const bool reshuffle_;
};

// The buffer is one flat vector of tensors, `size_` slots of `arity_` components each, so a pass
// allocates it once instead of once per element.
class ShuffleIterator final : public IteratorNode {
 public:
  ShuffleIterator(const ShuffleNode& node, uint64_t pass)
      : input_(node.input_->make_iterator(pass)),
        rng_(node.reshuffle_ ? mix_seed(node.seed_, pass) : node.seed_),
        buffer_size_(node.buffer_size_) {
    const int64_t n = node.input_->cardinality();
    reserve_slots_ = n >= 0 ? std::min(n, buffer_size_) : std::min<int64_t>(buffer_size_, 1 << 16);
    // Shuffling rows of fixed tensors: buffer row indices instead of elements. The sequence of
    // random draws and buffer moves is the same as for elements, so so is the order.
    rows_ = input_->row_source();
    if (rows_ != nullptr) {
      input_rows_ = n;
      indices_.reserve(static_cast<size_t>(reserve_slots_));
    }
  }

  bool next(Element& out) override {
    if (rows_ == nullptr) return advance(&out);
    int64_t index;
    if (!advance_index(&index)) return false;
    out.resize(rows_->size());
    for (size_t c = 0; c < rows_->size(); ++c) out[c] = (*rows_)[c][index];
    return true;
  }
  int64_t skip(int64_t n) override {
    int64_t k = 0;
    if (rows_ != nullptr) {
      while (k < n && advance_index(nullptr)) ++k;
      return k;
    }
    while (k < n && advance(nullptr)) ++k;
    return k;
  }
  const std::vector<Tensor>* row_source() const override { return rows_; }
  bool next_index(int64_t& index) override { return rows_ != nullptr && advance_index(&index); }

 private:
  // Pulls the next input element into scratch_; false at the end of the input.
  bool pull() {
    if (input_done_) return false;
    if (!input_->next(scratch_)) {
      input_done_ = true;
      return false;
    }
    if (arity_ < 0) {
      arity_ = static_cast<int64_t>(scratch_.size());
      buffer_.reserve(static_cast<size_t>(reserve_slots_ * arity_));
    }
    DTRAIN_INTERNAL_CHECK(static_cast<int64_t>(scratch_.size()) == arity_,
                          "shuffle: elements with ", scratch_.size(), " and ", arity_,
                          " components");
    return true;
  }

  // advance() over row indices: the buffer holds indices [0, input_rows_) in arrival order.
  bool advance_index(int64_t* out) {
    while (size_ < buffer_size_ && next_row_ < input_rows_) {
      indices_.push_back(next_row_++);
      ++size_;
    }
    if (size_ == 0) return false;
    const size_t slot = static_cast<size_t>(rng_.uniform_int(static_cast<uint64_t>(size_)));
    if (out != nullptr) *out = indices_[slot];
    if (next_row_ < input_rows_) {
      indices_[slot] = next_row_++;
    } else {
      --size_;
      indices_[slot] = indices_[static_cast<size_t>(size_)];
      indices_.pop_back();
    }
    return true;
  }

  // Returns a random buffered element (moved into *out unless null) and refills its slot.
  bool advance(Element* out) {
    while (size_ < buffer_size_ && pull()) {
      for (Tensor& t : scratch_) buffer_.push_back(std::move(t));
      ++size_;
    }
    if (size_ == 0) return false;
    const size_t slot = static_cast<size_t>(rng_.uniform_int(static_cast<uint64_t>(size_)));
    const size_t base = slot * static_cast<size_t>(arity_);
    if (out != nullptr) {
      out->resize(static_cast<size_t>(arity_));
      for (int64_t c = 0; c < arity_; ++c) (*out)[c] = std::move(buffer_[base + c]);
    }
    if (pull()) {
      for (int64_t c = 0; c < arity_; ++c) buffer_[base + c] = std::move(scratch_[c]);
    } else {
      // Input exhausted: move the last slot into the hole and shrink (keeps capacity).
      --size_;
      const size_t last = static_cast<size_t>(size_ * arity_);
      if (base != last) {
        for (int64_t c = 0; c < arity_; ++c) buffer_[base + c] = std::move(buffer_[last + c]);
      }
      buffer_.resize(last);
    }
    return true;
  }

  std::unique_ptr<IteratorNode> input_;
  Philox rng_;
  int64_t buffer_size_;
  int64_t reserve_slots_ = 0;
  int64_t arity_ = -1;  // components per element; known after the first element
  int64_t size_ = 0;    // elements in buffer_
  bool input_done_ = false;
  std::vector<Tensor> buffer_;
  Element scratch_;
  // Index mode (input is from_tensor_slices): the source tensors, their row count, the next row
  // not yet buffered, and the buffered row indices.
  const std::vector<Tensor>* rows_ = nullptr;
  int64_t input_rows_ = 0;
  int64_t next_row_ = 0;
  std::vector<int64_t> indices_;
};

std::unique_ptr<IteratorNode> ShuffleNode::make_iterator(uint64_t pass) const {
  return std::make_unique<ShuffleIterator>(*this, pass);
}

}  // namespace

NodePtr make_shuffle_node(NodePtr input, int64_t buffer_size, uint64_t seed, bool reshuffle) {
  return std::make_shared<ShuffleNode>(std::move(input), buffer_size, seed, reshuffle);
}

}  // namespace dtrain::data::detail
