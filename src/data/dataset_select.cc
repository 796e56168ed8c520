// Which elements a pass yields and how often: repeat, take, skip, shard.
#include <algorithm>
#include <utility>

#include "dataset_node.h"

namespace dtrain::data::detail {
namespace {

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

}  // namespace

NodePtr make_repeat_node(NodePtr input, int64_t count) {
  return std::make_shared<RepeatNode>(std::move(input), count);
}

NodePtr make_take_node(NodePtr input, int64_t count) {
  return std::make_shared<TakeNode>(std::move(input), count);
}

NodePtr make_skip_node(NodePtr input, int64_t count) {
  return std::make_shared<SkipNode>(std::move(input), count);
}

NodePtr make_shard_node(NodePtr input, int64_t num_shards, int64_t index) {
  return std::make_shared<ShardNode>(std::move(input), num_shards, index);
}

}  // namespace dtrain::data::detail
