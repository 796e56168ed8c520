// Dataset nodes (one per transformation) and their iterators. Each DatasetNode is immutable and
// shared; each pass builds a fresh chain of IteratorNodes. Iterators reuse their containers
// across elements, so a steady-state pass allocates only when it starts.
#include "dtrain/data/dataset.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "dtrain/core/float_env.h"
#include "dtrain/core/random.h"

namespace dtrain::data {
namespace detail {

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

namespace {

using NodePtr = std::shared_ptr<const DatasetNode>;

// ---- from_tensor_slices ----------------------------------------------------------------------

class SlicesNode final : public DatasetNode {
 public:
  explicit SlicesNode(std::vector<Tensor> components) : components_(std::move(components)) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override { return components_[0].dim(0); }

  const std::vector<Tensor> components_;
};

class SlicesIterator final : public IteratorNode {
 public:
  explicit SlicesIterator(std::shared_ptr<const SlicesNode> node)
      : node_(std::move(node)), size_(node_->cardinality()) {}

  bool next(Element& out) override {
    if (index_ >= size_) return false;
    const std::vector<Tensor>& components = node_->components_;
    out.resize(components.size());
    for (size_t c = 0; c < components.size(); ++c) out[c] = components[c][index_];
    ++index_;
    return true;
  }
  int64_t skip(int64_t n) override {
    const int64_t k = std::min(n, size_ - index_);
    index_ += k;
    return k;
  }
  const std::vector<Tensor>* row_source() const override { return &node_->components_; }
  bool next_index(int64_t& index) override {
    if (index_ >= size_) return false;
    index = index_++;
    return true;
  }

 private:
  std::shared_ptr<const SlicesNode> node_;
  int64_t size_;
  int64_t index_ = 0;
};

std::unique_ptr<IteratorNode> SlicesNode::make_iterator(uint64_t) const {
  return std::make_unique<SlicesIterator>(self<SlicesNode>());
}

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

// ---- repeat ----------------------------------------------------------------------------------

class RepeatNode final : public DatasetNode {
 public:
  RepeatNode(NodePtr input, int64_t count) : input_(std::move(input)), count_(count) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override {
    const int64_t n = input_->cardinality();
    if (count_ < 0) return n == 0 ? 0 : kInfiniteCardinality;
    if (count_ == 0) return 0;
    if (n < 0) return n;
    if (n == 0) return 0;
    return n > kMaxInt64 / count_ ? kInfiniteCardinality : n * count_;
  }

  const NodePtr input_;
  const int64_t count_;
};

class RepeatIterator final : public IteratorNode {
 public:
  RepeatIterator(std::shared_ptr<const RepeatNode> node, uint64_t pass)
      : node_(std::move(node)), pass_(pass) {}

  bool next(Element& out) override {
    while (open()) {
      if (input_->next(out)) {
        produced_ = true;
        return true;
      }
      close();
    }
    return false;
  }

  int64_t skip(int64_t n) override {
    int64_t k = 0;
    while (k < n && open()) {
      const int64_t s = input_->skip(n - k);
      if (s > 0) produced_ = true;
      k += s;
      if (k < n) close();
    }
    return k;
  }

 private:
  // Makes sure an input iterator is open; false when the repetitions are over.
  bool open() {
    if (done_) return false;
    if (!input_) {
      if (node_->count_ >= 0 && rep_ >= node_->count_) {
        done_ = true;
        return false;
      }
      const uint64_t stride =
          node_->count_ >= 0 ? static_cast<uint64_t>(node_->count_) : (uint64_t{1} << 32);
      input_ = node_->input_->make_iterator(pass_ * stride + static_cast<uint64_t>(rep_));
      produced_ = false;
    }
    return true;
  }
  // Ends the current repetition. An empty repetition ends everything (as in TF), rather than
  // spinning forever on an empty input.
  void close() {
    input_.reset();
    ++rep_;
    if (!produced_) done_ = true;
  }

  std::shared_ptr<const RepeatNode> node_;
  uint64_t pass_;
  int64_t rep_ = 0;
  bool produced_ = false;
  bool done_ = false;
  std::unique_ptr<IteratorNode> input_;
};

std::unique_ptr<IteratorNode> RepeatNode::make_iterator(uint64_t pass) const {
  return std::make_unique<RepeatIterator>(self<RepeatNode>(), pass);
}

// ---- take / skip -----------------------------------------------------------------------------

class TakeNode final : public DatasetNode {
 public:
  TakeNode(NodePtr input, int64_t count) : input_(std::move(input)), count_(count) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override {
    const int64_t n = input_->cardinality();
    if (count_ < 0) return n;
    if (n == kInfiniteCardinality) return count_;
    if (n == kUnknownCardinality) return count_ == 0 ? 0 : n;
    return std::min(n, count_);
  }

  const NodePtr input_;
  const int64_t count_;
};

class TakeIterator final : public IteratorNode {
 public:
  TakeIterator(const TakeNode& node, uint64_t pass)
      : input_(node.input_->make_iterator(pass)),
        remaining_(node.count_ < 0 ? kMaxInt64 : node.count_) {}

  bool next(Element& out) override {
    if (remaining_ == 0 || !input_->next(out)) {
      remaining_ = 0;
      return false;
    }
    --remaining_;
    return true;
  }
  int64_t skip(int64_t n) override {
    const int64_t k = input_->skip(std::min(n, remaining_));
    remaining_ = k < std::min(n, remaining_) ? 0 : remaining_ - k;
    return k;
  }

 private:
  std::unique_ptr<IteratorNode> input_;
  int64_t remaining_;
};

std::unique_ptr<IteratorNode> TakeNode::make_iterator(uint64_t pass) const {
  return std::make_unique<TakeIterator>(*this, pass);
}

class SkipNode final : public DatasetNode {
 public:
  SkipNode(NodePtr input, int64_t count) : input_(std::move(input)), count_(count) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override {
    const int64_t n = input_->cardinality();
    if (n < 0) return n;
    if (count_ < 0) return 0;
    return std::max<int64_t>(0, n - count_);
  }

  const NodePtr input_;
  const int64_t count_;
};

class SkipIterator final : public IteratorNode {
 public:
  SkipIterator(const SkipNode& node, uint64_t pass)
      : input_(node.input_->make_iterator(pass)),
        pending_(node.count_ < 0 ? kMaxInt64 : node.count_) {}

  bool next(Element& out) override {
    if (!skip_prefix()) return false;
    return input_->next(out);
  }
  int64_t skip(int64_t n) override {
    if (!skip_prefix()) return 0;
    return input_->skip(n);
  }

 private:
  // Skips the first `count` input elements on first use; false if the input ended there.
  bool skip_prefix() {
    if (pending_ > 0) {
      const int64_t k = input_->skip(pending_);
      exhausted_ = k < pending_;
      pending_ = 0;
    }
    return !exhausted_;
  }

  std::unique_ptr<IteratorNode> input_;
  int64_t pending_;
  bool exhausted_ = false;
};

std::unique_ptr<IteratorNode> SkipNode::make_iterator(uint64_t pass) const {
  return std::make_unique<SkipIterator>(*this, pass);
}

// ---- shard -----------------------------------------------------------------------------------

class ShardNode final : public DatasetNode {
 public:
  ShardNode(NodePtr input, int64_t num_shards, int64_t index)
      : input_(std::move(input)), num_shards_(num_shards), index_(index) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override {
    const int64_t n = input_->cardinality();
    if (n < 0) return n;
    return n / num_shards_ + (index_ < n % num_shards_ ? 1 : 0);
  }

  const NodePtr input_;
  const int64_t num_shards_;
  const int64_t index_;
};

class ShardIterator final : public IteratorNode {
 public:
  ShardIterator(const ShardNode& node, uint64_t pass)
      : input_(node.input_->make_iterator(pass)),
        num_shards_(node.num_shards_),
        index_(node.index_) {}

  bool next(Element& out) override {
    if (done_ || !skip_gap() || !input_->next(out)) {
      done_ = true;
      return false;
    }
    return true;
  }
  int64_t skip(int64_t n) override {
    int64_t k = 0;
    while (k < n && !done_) {
      if (skip_gap() && input_->skip(1) == 1) {
        ++k;
      } else {
        done_ = true;
      }
    }
    return k;
  }

 private:
  // Skips the input elements that belong to other shards before our next one.
  bool skip_gap() {
    const int64_t gap = first_ ? index_ : num_shards_ - 1;
    first_ = false;
    return input_->skip(gap) == gap;
  }

  std::unique_ptr<IteratorNode> input_;
  int64_t num_shards_;
  int64_t index_;
  bool first_ = true;
  bool done_ = false;
};

std::unique_ptr<IteratorNode> ShardNode::make_iterator(uint64_t pass) const {
  return std::make_unique<ShardIterator>(*this, pass);
}

// ---- prefetch --------------------------------------------------------------------------------

class PrefetchNode final : public DatasetNode {
 public:
  PrefetchNode(NodePtr input, int64_t buffer_size)
      : input_(std::move(input)), buffer_size_(buffer_size) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override { return input_->cardinality(); }

  const NodePtr input_;
  const int64_t buffer_size_;
};

// A ring of `capacity` element slots: the producer thread fills slots [head + count, ...), the
// consumer takes slot head. A slot is owned by exactly one side at a time, so elements are
// swapped in and out without holding the lock. The thread starts on the first next(), so that
// iterator_from() can fast-forward the input directly.
class PrefetchIterator final : public IteratorNode {
 public:
  PrefetchIterator(const PrefetchNode& node, uint64_t pass)
      : input_(node.input_->make_iterator(pass)), ring_(static_cast<size_t>(node.buffer_size_)) {}

  ~PrefetchIterator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    space_cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  bool next(Element& out) override {
    if (!thread_.joinable()) thread_ = start_thread([this] { produce(); });
    std::unique_lock<std::mutex> lock(mu_);
    item_cv_.wait(lock, [this] { return count_ > 0 || finished_; });
    if (count_ == 0) {
      if (error_) std::rethrow_exception(error_);
      return false;
    }
    const size_t slot = head_;
    lock.unlock();
    out.swap(ring_[slot]);
    ring_[slot].clear();  // releases the consumer's previous element now; keeps the capacity
    lock.lock();
    head_ = (head_ + 1) % ring_.size();
    --count_;
    lock.unlock();
    space_cv_.notify_one();
    return true;
  }

  int64_t skip(int64_t n) override {
    if (!thread_.joinable()) return input_->skip(n);
    return IteratorNode::skip(n);
  }

 private:
  void produce() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      space_cv_.wait(lock, [this] { return stop_ || count_ < ring_.size(); });
      if (stop_) return;
      const size_t slot = (head_ + count_) % ring_.size();
      lock.unlock();
      bool ok = false;
      std::exception_ptr error;
      try {
        ok = input_->next(ring_[slot]);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      if (!ok) {
        error_ = error;
        finished_ = true;
        item_cv_.notify_one();
        return;
      }
      ++count_;
      item_cv_.notify_one();
    }
  }

  std::unique_ptr<IteratorNode> input_;  // used by the producer thread once it has started
  std::vector<Element> ring_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable item_cv_;   // signalled when count_ grows or finished_ is set
  std::condition_variable space_cv_;  // signalled when count_ shrinks or stop_ is set
  size_t head_ = 0;                   // guarded by mu_
  size_t count_ = 0;                  // guarded by mu_
  bool finished_ = false;             // guarded by mu_
  bool stop_ = false;                 // guarded by mu_
  std::exception_ptr error_;          // guarded by mu_
};

std::unique_ptr<IteratorNode> PrefetchNode::make_iterator(uint64_t pass) const {
  return std::make_unique<PrefetchIterator>(*this, pass);
}

}  // namespace
}  // namespace detail

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
  return Dataset(std::make_shared<detail::SlicesNode>(std::move(components)));
}

Dataset Dataset::map(MapFn fn) const {
  check_defined(*this, "map");
  DTRAIN_CHECK(fn != nullptr, "Dataset::map: empty function");
  return Dataset(std::make_shared<detail::MapNode>(node_, std::move(fn)));
}

Dataset Dataset::shuffle(int64_t buffer_size, std::optional<uint64_t> seed,
                         bool reshuffle_each_iteration) const {
  check_defined(*this, "shuffle");
  DTRAIN_CHECK(buffer_size >= 1, "Dataset::shuffle: buffer_size must be >= 1, got ", buffer_size);
  const uint64_t s = seed.has_value() ? *seed : next_seed();
  return Dataset(
      std::make_shared<detail::ShuffleNode>(node_, buffer_size, s, reshuffle_each_iteration));
}

Dataset Dataset::batch(int64_t batch_size, bool drop_remainder) const {
  check_defined(*this, "batch");
  DTRAIN_CHECK(batch_size >= 1, "Dataset::batch: batch_size must be >= 1, got ", batch_size);
  return Dataset(std::make_shared<detail::BatchNode>(node_, batch_size, drop_remainder));
}

Dataset Dataset::repeat(int64_t count) const {
  check_defined(*this, "repeat");
  DTRAIN_CHECK(count >= -1, "Dataset::repeat: count must be >= -1, got ", count);
  return Dataset(std::make_shared<detail::RepeatNode>(node_, count));
}

Dataset Dataset::take(int64_t count) const {
  check_defined(*this, "take");
  DTRAIN_CHECK(count >= -1, "Dataset::take: count must be >= -1, got ", count);
  return Dataset(std::make_shared<detail::TakeNode>(node_, count));
}

Dataset Dataset::skip(int64_t count) const {
  check_defined(*this, "skip");
  DTRAIN_CHECK(count >= -1, "Dataset::skip: count must be >= -1, got ", count);
  return Dataset(std::make_shared<detail::SkipNode>(node_, count));
}

Dataset Dataset::shard(int64_t num_shards, int64_t index) const {
  check_defined(*this, "shard");
  DTRAIN_CHECK(num_shards >= 1, "Dataset::shard: num_shards must be >= 1, got ", num_shards);
  DTRAIN_CHECK(0 <= index && index < num_shards, "Dataset::shard: index ", index,
               " out of range for ", num_shards, " shards");
  return Dataset(std::make_shared<detail::ShardNode>(node_, num_shards, index));
}

Dataset Dataset::prefetch(int64_t buffer_size) const {
  check_defined(*this, "prefetch");
  DTRAIN_CHECK(buffer_size >= 1 || buffer_size == kAutotune,
               "Dataset::prefetch: buffer_size must be >= 1 or kAutotune, got ", buffer_size);
  return Dataset(std::make_shared<detail::PrefetchNode>(
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
