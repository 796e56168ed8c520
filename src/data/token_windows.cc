// token_windows: a source node whose element i is a pair of views into one token stream, so a
// corpus of N tokens costs N ids however many (overlapping) windows it has.
#include <memory>
#include <utility>

#include "dataset_node.h"
#include "dtrain/core/error.h"
#include "dtrain/data/text.h"

namespace dtrain::data {
namespace detail {
namespace {

class WindowsNode final : public DatasetNode {
 public:
  WindowsNode(Tensor tokens, int64_t length, int64_t stride)
      : tokens_(std::move(tokens)),
        length_(length),
        stride_(stride),
        count_((tokens_.dim(0) - length - 1) / stride + 1) {}
  std::unique_ptr<IteratorNode> make_iterator(uint64_t pass) const override;
  int64_t cardinality() const override { return count_; }

  const Tensor tokens_;
  const int64_t length_;
  const int64_t stride_;
  const int64_t count_;
};

class WindowsIterator final : public IteratorNode {
 public:
  explicit WindowsIterator(std::shared_ptr<const WindowsNode> node) : node_(std::move(node)) {}

  bool next(Element& out) override {
    if (index_ >= node_->count_) return false;
    const int64_t start = index_ * node_->stride_;
    out.resize(2);
    out[0] = node_->tokens_.slice(start, start + node_->length_);
    out[1] = node_->tokens_.slice(start + 1, start + node_->length_ + 1);
    ++index_;
    return true;
  }
  int64_t skip(int64_t n) override {
    const int64_t k = std::min(n, node_->count_ - index_);
    index_ += k;
    return k;
  }

 private:
  std::shared_ptr<const WindowsNode> node_;
  int64_t index_ = 0;
};

std::unique_ptr<IteratorNode> WindowsNode::make_iterator(uint64_t) const {
  return std::make_unique<WindowsIterator>(self<WindowsNode>());
}

}  // namespace
}  // namespace detail

Dataset token_windows(Tensor tokens, const TokenWindowsOptions& options) {
  DTRAIN_CHECK(tokens.defined() && tokens.dtype() == DType::kInt32 && tokens.rank() == 1,
               "token_windows: tokens must be an int32 [N] tensor of token ids, got ",
               tokens.defined()
                   ? str_cat(dtype_name(tokens.dtype()), " ", tokens.shape().to_string())
                   : std::string("an undefined tensor"));
  const int64_t t = options.sequence_length;
  DTRAIN_CHECK(t >= 1, "token_windows: sequence_length must be >= 1, got ", t);
  DTRAIN_CHECK(options.stride >= 1, "token_windows: stride must be >= 1, got ", options.stride);
  DTRAIN_CHECK(tokens.dim(0) >= t + 1, "token_windows: the token stream has ", tokens.dim(0),
               " tokens, fewer than one window of sequence_length + 1 = ", t + 1);
  return detail::DatasetAccess::wrap(
      std::make_shared<detail::WindowsNode>(std::move(tokens), t, options.stride));
}

}  // namespace dtrain::data
