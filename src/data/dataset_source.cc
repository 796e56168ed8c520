// Source datasets: from_tensor_slices (rows of fixed tensors, zero-copy views).
#include <algorithm>
#include <utility>

#include "dataset_node.h"

namespace dtrain::data::detail {
namespace {

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

}  // namespace

NodePtr make_slices_node(std::vector<Tensor> components) {
  return std::make_shared<SlicesNode>(std::move(components));
}

}  // namespace dtrain::data::detail
