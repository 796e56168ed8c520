// prefetch: a producer thread fills a ring of elements ahead of the consumer.
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>

#include "dataset_node.h"
#include "dtrain/core/float_env.h"

namespace dtrain::data::detail {
namespace {

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

NodePtr make_prefetch_node(NodePtr input, int64_t buffer_size) {
  return std::make_shared<PrefetchNode>(std::move(input), buffer_size);
}

}  // namespace dtrain::data::detail
