// OverlappedGradientReduction: buckets in reverse variable order, a communication thread that
// reduces them in bucket order as they complete, in the summation order of the one all-reduce.
#include "dtrain/distribute/gradient_overlap.h"

#include <utility>

#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"

namespace dtrain::distribute {

OverlappedGradientReduction::OverlappedGradientReduction(Collectives& collectives,
                                                         std::span<Tensor> out,
                                                         std::span<Tensor> extra,
                                                         size_t bucket_bytes)
    : collectives_(collectives), out_(out), extra_(extra) {
  DTRAIN_CHECK(bucket_bytes > 0, "OverlappedGradientReduction: bucket_bytes must be positive");
  for (size_t v = 0; v < out.size(); ++v) {
    DTRAIN_CHECK(out[v].defined() && out[v].dtype() == DType::kFloat32,
                 "OverlappedGradientReduction: gradient ", v, " must be a defined float32 tensor");
  }
  for (size_t k = 0; k < extra.size(); ++k) {
    DTRAIN_CHECK(extra[k].defined() &&
                     (extra[k].dtype() == DType::kFloat32 || extra[k].dtype() == DType::kFloat64),
                 "OverlappedGradientReduction: extra tensor ", k,
                 " must be a defined float32 or float64 tensor");
  }
  // The list Strategy::reduce_gradients all-reduces in one call: its summation order is ours.
  std::vector<Tensor> all(out.begin(), out.end());
  all.insert(all.end(), extra.begin(), extra.end());
  order_ = collectives.summation_order(all);
  bucket_of_.resize(out.size());
  size_t bytes = 0;
  for (size_t i = out.size(); i-- > 0;) {
    if (buckets_.empty() || (bytes > 0 && bytes + out[i].nbytes() > bucket_bytes)) {
      buckets_.emplace_back();
      bytes = 0;
    }
    buckets_.back().push_back(i);
    bucket_of_[i] = buckets_.size() - 1;
    bytes += out[i].nbytes();
  }
  src_.resize(out.size());
  remaining_.resize(buckets_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) remaining_[b] = buckets_[b].size();
  // Over shared memory a reduction is the CPU's own copying and adding, not waiting on a wire: a
  // second thread would only compete with backward for the cores (docs/decisions.md), and with
  // nothing to overlap, reducing each bucket as it completes only added a barrier per bucket. So
  // finish() reduces every bucket in one collective (the same sums: each element's order is its
  // owner's), on the thread that ran backward.
  inline_ = collectives.uses_shared_memory();
  if (!inline_) thread_ = start_thread([this] { loop(); });
}

OverlappedGradientReduction::~OverlappedGradientReduction() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    dropping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void OverlappedGradientReduction::gradient_ready(size_t v, const Tensor& g) {
  DTRAIN_CHECK(v < out_.size(), "OverlappedGradientReduction: gradient ", v, " of ", out_.size());
  DTRAIN_CHECK(
      !g.defined() || (g.dtype() == DType::kFloat32 && g.num_elements() == out_[v].num_elements()),
      "OverlappedGradientReduction: gradient ", v, " is ", g.to_string(0), ", expected ",
      out_[v].to_string(0));
  if (inline_) {
    size_t& left = remaining_[bucket_of_[v]];
    DTRAIN_CHECK(left > 0, "OverlappedGradientReduction: gradient ", v,
                 " reported twice in one step");
    src_[v] = g;
    --left;
    return;
  }
  bool ready = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t& left = remaining_[bucket_of_[v]];
    DTRAIN_CHECK(left > 0, "OverlappedGradientReduction: gradient ", v,
                 " reported twice in one step");
    src_[v] = g;
    ready = --left == 0;
  }
  if (ready) cv_.notify_all();
}

void OverlappedGradientReduction::reduce_item(size_t item) {
  if (item < buckets_.size()) {
    reduce_bucket(item);
    reduced_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    reduce_extras();
  }
}

void OverlappedGradientReduction::reset_step() {
  next_ = 0;
  finishing_ = false;
  for (size_t b = 0; b < buckets_.size(); ++b) remaining_[b] = buckets_[b].size();
  for (Tensor& t : src_) t = Tensor();  // keeps no references past the step
}

void OverlappedGradientReduction::finish() {
  if (inline_) {
    // Every bucket (zeros for gradients that never came) and the float32 extras in one
    // collective, as the plain step's one all-reduce; float64 extras in a second.
    try {
      pieces_.clear();
      for (size_t b = 0; b < buckets_.size(); ++b) add_bucket_pieces(b);
      add_extra_pieces(DType::kFloat32);
      collectives_.all_reduce_in_order(pieces_, DType::kFloat32, 0);
      reduced_.fetch_add(buckets_.size(), std::memory_order_acq_rel);
      pieces_.clear();
      add_extra_pieces(DType::kFloat64);
      if (!pieces_.empty()) collectives_.all_reduce_in_order(pieces_, DType::kFloat64, 1);
    } catch (...) {
      reset_step();
      throw;
    }
    reset_step();
    return;
  }
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    finishing_ = true;
    cv_.notify_all();
    done_cv_.wait(lock, [this] { return next_ > buckets_.size(); });
    error = std::exchange(error_, nullptr);
    next_ = 0;
    finishing_ = false;
    for (size_t b = 0; b < buckets_.size(); ++b) remaining_[b] = buckets_[b].size();
  }
  for (Tensor& t : src_) t = Tensor();  // keeps no references past the step
  if (error) std::rethrow_exception(error);
}

void OverlappedGradientReduction::abandon() noexcept {
  if (inline_) {
    error_ = nullptr;
    reset_step();
    return;
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    dropping_ = true;
    done_cv_.wait(lock, [this] { return !busy_; });
    dropping_ = false;
    error_ = nullptr;
    next_ = 0;
    finishing_ = false;
    for (size_t b = 0; b < buckets_.size(); ++b) remaining_[b] = buckets_[b].size();
  }
  for (Tensor& t : src_) t = Tensor();
}

void OverlappedGradientReduction::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  const auto has_work = [this] {
    if (dropping_ || next_ > buckets_.size()) return false;
    if (next_ == buckets_.size()) return finishing_;
    return finishing_ || remaining_[next_] == 0;
  };
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || has_work(); });
    if (stop_) return;
    const size_t item = next_;
    const bool failed = error_ != nullptr;
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    if (!failed) {
      follow_flush_denormals();
      try {
        reduce_item(item);
      } catch (...) {
        error = std::current_exception();
      }
    }
    lock.lock();
    busy_ = false;
    if (error) error_ = error;
    if (!dropping_) ++next_;
    done_cv_.notify_all();
  }
}

void OverlappedGradientReduction::reduce_bucket(size_t b) {
  pieces_.clear();
  add_bucket_pieces(b);
  collectives_.all_reduce_in_order(pieces_, DType::kFloat32, b);
}

void OverlappedGradientReduction::add_bucket_pieces(size_t b) {
  for (size_t v : buckets_[b]) {
    const Tensor& g = src_[v];
    const auto* src = g.defined() ? static_cast<const float*>(g.raw_data()) : nullptr;
    auto* dst = static_cast<float*>(out_[v].raw_data());
    for (const SumRange& r : order_[v]) {
      pieces_.push_back({.src = src == nullptr ? nullptr : src + r.begin,
                         .dst = dst + r.begin,
                         .count = static_cast<size_t>(r.end - r.begin),
                         .owner = r.owner});
    }
  }
}

void OverlappedGradientReduction::add_extra_pieces(DType d) {
  const size_t elem = dtype_size(d);
  for (size_t k = 0; k < extra_.size(); ++k) {
    if (extra_[k].dtype() != d) continue;
    auto* data = static_cast<char*>(extra_[k].raw_data());
    for (const SumRange& r : order_[out_.size() + k]) {
      pieces_.push_back({.src = data + r.begin * elem,
                         .dst = data + r.begin * elem,
                         .count = static_cast<size_t>(r.end - r.begin),
                         .owner = r.owner});
    }
  }
}

void OverlappedGradientReduction::reduce_extras() {
  for (const DType d : {DType::kFloat32, DType::kFloat64}) {
    pieces_.clear();
    add_extra_pieces(d);
    if (!pieces_.empty()) {
      collectives_.all_reduce_in_order(pieces_, d, buckets_.size() + (d == DType::kFloat64));
    }
  }
}

}  // namespace dtrain::distribute
