// Element transformations: map (1:1 function) and batch (stacks consecutive elements).
#include <algorithm>
#include <cstring>
#include <utility>

#include "dataset_node.h"

namespace dtrain::data::detail {
namespace {

// ---- map -------------------------------------------------------------------------------------

class MapNode final : public DatasetNode {
 public:
  MapNode(NodePtr input, Dataset::MapFn fn) : input_(std::move(input)), fn_(std::move(fn)) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override { return input_->cardinality(); }

  const NodePtr input_;
  const Dataset::MapFn fn_;
};

class MapIterator final : public IteratorNode {
 public:
  MapIterator(std::shared_ptr<const MapNode> node, uint64_t pass)
      : node_(std::move(node)), input_(node_->input_->make_iterator(pass)) {}

  bool next(Element& out) override {
    if (!input_->next(out)) return false;
    out = node_->fn_(std::move(out));
    return true;
  }
  // Map functions are 1:1 and deterministic, so skipping never needs to call them.
  int64_t skip(int64_t n) override { return input_->skip(n); }

 private:
  std::shared_ptr<const MapNode> node_;
  std::unique_ptr<IteratorNode> input_;
};

std::unique_ptr<IteratorNode> MapNode::make_iterator(uint64_t pass) const {
  return std::make_unique<MapIterator>(self<MapNode>(), pass);
}

// ---- batch -----------------------------------------------------------------------------------

class BatchNode final : public DatasetNode {
 public:
  BatchNode(NodePtr input, int64_t batch_size, bool drop_remainder)
      : input_(std::move(input)), batch_size_(batch_size), drop_remainder_(drop_remainder) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override {
    const int64_t n = input_->cardinality();
    if (n < 0) return n;
    return drop_remainder_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
  }

  const NodePtr input_;
  const int64_t batch_size_;
  const bool drop_remainder_;
};

// True when `batch` (of shape [B] + s) holds rows of shape `row`, i.e. row == s.
bool row_shape_matches(const Shape& batch, const Shape& row) {
  if (batch.rank() != row.rank() + 1) return false;
  for (int i = 0; i < row.rank(); ++i) {
    if (batch[i + 1] != row[i]) return false;
  }
  return true;
}

class BatchIterator final : public IteratorNode {
 public:
  BatchIterator(const BatchNode& node, uint64_t pass)
      : input_(node.input_->make_iterator(pass)),
        batch_size_(node.batch_size_),
        drop_remainder_(node.drop_remainder_) {}

  bool next(Element& out) override {
    if (const std::vector<Tensor>* source = input_->row_source()) return next_rows(*source, out);
    int64_t rows = 0;
    for (; rows < batch_size_ && input_->next(scratch_); ++rows) {
      if (rows == 0) start_batch();
      DTRAIN_CHECK(scratch_.size() == batch_.size(), "batch: element ", rows, " of the batch has ",
                   scratch_.size(), " components, the first has ", batch_.size());
      for (size_t c = 0; c < batch_.size(); ++c) {
        const Tensor& t = scratch_[c];
        Tensor& b = batch_[c];
        DTRAIN_CHECK(
            t.defined() && t.dtype() == b.dtype() && row_shape_matches(b.shape(), t.shape()),
            "batch: cannot batch tensors with different shapes or dtypes in component ", c,
            ": the first element has ", dtype_name(b.dtype()), " ",
            b.shape().without_first().to_string(), ", element ", rows, " has ",
            t.defined() ? dtype_name(t.dtype()) : "undefined", " ", t.shape().to_string());
        const size_t row_bytes = t.nbytes();
        std::memcpy(static_cast<char*>(b.raw_data()) + rows * row_bytes, t.raw_data(), row_bytes);
      }
    }
    return finish(rows, out);
  }

  int64_t skip(int64_t n) override {
    const int64_t rows = n > kMaxInt64 / batch_size_ ? kMaxInt64 : n * batch_size_;
    const int64_t k = input_->skip(rows);
    if (k == rows) return n;
    return drop_remainder_ ? k / batch_size_ : (k + batch_size_ - 1) / batch_size_;
  }

 private:
  // Gathers rows of the source tensors straight into the batch (no per-element views).
  // The indices are drawn first, so that the rows a few places ahead can be prefetched while one
  // is copied: shuffled rows come from all over memory, and waiting for each in turn cost as much
  // as copying them.
  bool next_rows(const std::vector<Tensor>& source, Element& out) {
    indices_.resize(static_cast<size_t>(batch_size_));
    int64_t rows = 0;
    while (rows < batch_size_ && input_->next_index(indices_[static_cast<size_t>(rows)])) ++rows;
    if (rows == 0) return finish(0, out);
    batch_.resize(source.size());
    for (size_t c = 0; c < source.size(); ++c) {
      batch_[c] =
          Tensor(source[c].dtype(), source[c].shape().without_first().with_first(batch_size_));
    }
    constexpr int64_t kAhead = 4;  // rows prefetched ahead of the copy
    constexpr size_t kLine = 64;
    for (size_t c = 0; c < source.size(); ++c) {
      const size_t row_bytes = source[c].nbytes() / static_cast<size_t>(source[c].dim(0));
      const auto* src = static_cast<const char*>(source[c].raw_data());
      auto* dst = static_cast<char*>(batch_[c].raw_data());
      auto prefetch = [&](int64_t r) {
        const char* p = src + indices_[static_cast<size_t>(r)] * row_bytes;
        for (size_t off = 0; off < row_bytes; off += kLine) __builtin_prefetch(p + off, 0, 0);
      };
      for (int64_t r = 0; r < std::min(kAhead, rows); ++r) prefetch(r);
      for (int64_t r = 0; r < rows; ++r) {
        if (r + kAhead < rows) prefetch(r + kAhead);
        std::memcpy(dst + r * row_bytes, src + indices_[static_cast<size_t>(r)] * row_bytes,
                    row_bytes);
      }
    }
    return finish(rows, out);
  }

  // Hands out the batch of `rows` rows; false (and nothing) when there is none to give.
  bool finish(int64_t rows, Element& out) {
    if (rows == 0 || (rows < batch_size_ && drop_remainder_)) {
      for (Tensor& b : batch_) b = Tensor();
      return false;
    }
    out.resize(batch_.size());
    for (size_t c = 0; c < batch_.size(); ++c) {
      // A short final batch is a view of the first `rows` rows: same buffer size as a full batch,
      // so the caching allocator serves every batch of the next pass from the same free list.
      out[c] = rows == batch_size_ ? std::move(batch_[c]) : batch_[c].slice(0, rows);
      batch_[c] = Tensor();
    }
    return true;
  }

  // Allocates the batch tensors for the element in scratch_.
  void start_batch() {
    batch_.resize(scratch_.size());
    for (size_t c = 0; c < scratch_.size(); ++c) {
      const Tensor& t = scratch_[c];
      DTRAIN_CHECK(t.defined(), "batch: component ", c, " of an element is undefined");
      batch_[c] = Tensor(t.dtype(), t.shape().with_first(batch_size_));
    }
  }

  std::unique_ptr<IteratorNode> input_;
  int64_t batch_size_;
  bool drop_remainder_;
  Element scratch_;
  std::vector<Tensor> batch_;
  std::vector<int64_t> indices_;  // next_rows: the batch's source rows
};

std::unique_ptr<IteratorNode> BatchNode::make_iterator(uint64_t pass) const {
  return std::make_unique<BatchIterator>(*this, pass);
}

}  // namespace

NodePtr make_map_node(NodePtr input, Dataset::MapFn fn) {
  return std::make_shared<MapNode>(std::move(input), std::move(fn));
}

NodePtr make_batch_node(NodePtr input, int64_t batch_size, bool drop_remainder) {
  return std::make_shared<BatchNode>(std::move(input), batch_size, drop_remainder);
}

}  // namespace dtrain::data::detail
