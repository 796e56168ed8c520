// ReplicaAllReduce: the last local replica to arrive sums every replica's values in replica
// order, all-reduces the sum across workers and hands it back to all of them.
#include "dtrain/distribute/replica_all_reduce.h"

#include <algorithm>

#include "dtrain/core/error.h"

namespace dtrain::distribute {

ReplicaAllReduce::ReplicaAllReduce(Strategy& strategy, std::chrono::milliseconds timeout)
    : st_(strategy),
      timeout_(timeout),
      slots_(static_cast<size_t>(strategy.num_local_replicas())) {}

void ReplicaAllReduce::all_reduce_sum(std::span<double> values) {
  const int n = st_.num_local_replicas();
  const int local = current_local_replica();
  if (n == 1 || local < 0) {
    DTRAIN_CHECK(n == 1, "ReplicaAllReduce: called outside Strategy::run with ", n,
                 " local replicas");
    if (st_.num_workers() > 1) {
      Tensor& sum = buffer(values.size());
      std::copy(values.begin(), values.end(), sum.data<double>());
      st_.all_reduce_across_workers(std::span<Tensor>(&sum, 1), ReduceOp::kSum);
      std::copy_n(sum.data<double>(), values.size(), values.begin());
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = generation_;
  slots_[static_cast<size_t>(local)] = values;
  if (++arrived_ < n) {
    if (!cv_.wait_for(lock, timeout_, [&] { return generation_ != gen; })) {
      // Leave the round broken for everyone: a replica failed before reaching it.
      failed_ = true;
      throw DeadlineExceededError(str_cat("ReplicaAllReduce: local replica ", local, " waited ",
                                          timeout_.count(),
                                          " ms for the other replicas (did one fail?)"));
    }
    if (failed_) {
      throw UnavailableError(
          "ReplicaAllReduce: the cross-worker reduction failed on another "
          "replica thread");
    }
    return;
  }
  // The last to arrive: sum in replica order, then across workers, then hand back.
  const size_t len = values.size();
  for (const auto& s : slots_) {
    DTRAIN_CHECK(s.size() == len, "ReplicaAllReduce: replicas passed ", s.size(), " and ", len,
                 " values");
  }
  Tensor& sum = buffer(len);
  double* p = sum.data<double>();
  std::copy(slots_[0].begin(), slots_[0].end(), p);
  for (int r = 1; r < n; ++r) {
    for (size_t i = 0; i < len; ++i) p[i] += slots_[static_cast<size_t>(r)][i];
  }
  failed_ = false;
  try {
    if (st_.num_workers() > 1) {
      st_.all_reduce_across_workers(std::span<Tensor>(&sum, 1), ReduceOp::kSum);
    }
  } catch (...) {
    failed_ = true;
    arrived_ = 0;
    ++generation_;
    lock.unlock();
    cv_.notify_all();
    throw;
  }
  for (auto& s : slots_) std::copy_n(p, len, s.begin());
  arrived_ = 0;
  ++generation_;
  lock.unlock();
  cv_.notify_all();
}

Tensor& ReplicaAllReduce::buffer(size_t n) {
  for (Tensor& t : buffers_) {
    if (t.num_elements() == static_cast<int64_t>(n)) return t;
  }
  buffers_.emplace_back(DType::kFloat64, Shape{static_cast<int64_t>(n)});
  return buffers_.back();
}

}  // namespace dtrain::distribute
