// ReplicaAllReduce: the last local replica to arrive sums every replica's values in replica
// order, all-reduces the sum across workers and hands it back to all of them.
#include "dtrain/distribute/replica_all_reduce.h"

#include <algorithm>
#include <iterator>

#include "dtrain/core/error.h"

namespace dtrain::distribute {

ReplicaAllReduce::ReplicaAllReduce(Strategy& strategy, std::chrono::milliseconds timeout)
    : st_(strategy),
      timeout_(timeout),
      slots_(static_cast<size_t>(strategy.num_local_replicas())) {}

namespace {

template <class T>
void gather_rows(Strategy& st, const Tensor& local, Tensor& out, Tensor& send, Tensor& recv) {
  const int64_t workers = st.num_workers();
  const int64_t replicas = st.num_replicas_in_sync();
  const int64_t n = local.dim(1);
  const int64_t block = (replicas + workers - 1) / workers;  // the most any worker holds
  const int64_t record = 2 + block * n;
  if (send.num_elements() != record || send.dtype() != local.dtype()) {
    send = Tensor(local.dtype(), Shape{record});
    recv = Tensor(local.dtype(), Shape{workers, record});
  }
  T* s = send.data<T>();
  s[0] = static_cast<T>(st.replica_id(0));
  s[1] = static_cast<T>(local.dim(0));
  const T* l = local.data<T>();
  std::copy(l, l + local.num_elements(), s + 2);
  std::fill(s + 2 + local.num_elements(), s + record, T(0));
  st.all_gather_across_workers(send, recv);
  const T* r = recv.data<T>();
  T* o = out.data<T>();
  int64_t covered = 0;
  for (int64_t w = 0; w < workers; ++w) {
    const T* rec = r + w * record;
    const auto first = static_cast<int64_t>(rec[0]);
    const auto count = static_cast<int64_t>(rec[1]);
    DTRAIN_INTERNAL_CHECK(first >= 0 && count >= 0 && count <= block && first + count <= replicas,
                          "ReplicaGather: worker ", w, " sent replicas [", first, ", ",
                          first + count, ") of ", replicas);
    std::copy(rec + 2, rec + 2 + count * n, o + first * n);
    covered += count;
  }
  DTRAIN_INTERNAL_CHECK(covered == replicas, "ReplicaGather: the workers sent ", covered,
                        " replicas' rows, not ", replicas);
}

}  // namespace

void ReplicaGather::gather(const Tensor& local, Tensor& out) {
  const int64_t replicas = st_.num_replicas_in_sync();
  const bool is_float = local.dtype() == DType::kFloat32 || local.dtype() == DType::kFloat64;
  if (!is_float || local.rank() != 2 || local.dim(0) != st_.num_local_replicas() ||
      out.dtype() != local.dtype() || out.rank() != 2 || out.dim(0) != replicas ||
      out.dim(1) != local.dim(1)) {
    throw InvalidArgumentError(str_cat("ReplicaGather: ", local.to_string(0), " (one row per ",
                                       st_.num_local_replicas(), " local replicas) into ",
                                       out.to_string(0), " (one row per ", replicas,
                                       " replicas in sync, float32 or float64)"));
  }
  if (st_.num_workers() == 1) {
    out.copy_from(local);
    return;
  }
  if (local.dtype() == DType::kFloat32) {
    gather_rows<float>(st_, local, out, send_, recv_);
  } else {
    gather_rows<double>(st_, local, out, send_, recv_);
  }
}

void ReplicaAllReduce::all_reduce_sum(std::span<double> values) {
  const int n = st_.num_local_replicas();
  const int local = current_local_replica();
  if (n == 1 || local < 0) {
    DTRAIN_CHECK(n == 1, "ReplicaAllReduce: called outside Strategy::run with ", n,
                 " local replicas");
    if (st_.num_workers() > 1) {
      Tensor& sum = buffer(values.size());
      slots_[0] = values;
      sum_slots(sum);
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
  failed_ = false;
  try {
    sum_slots(sum);
  } catch (...) {
    failed_ = true;
    arrived_ = 0;
    ++generation_;
    lock.unlock();
    cv_.notify_all();
    throw;
  }
  const double* p = sum.data<double>();
  for (auto& s : slots_) std::copy_n(p, len, s.begin());
  arrived_ = 0;
  ++generation_;
  lock.unlock();
  cv_.notify_all();
}

void ReplicaAllReduce::sum_slots(Tensor& sum) {
  const auto len = static_cast<size_t>(sum.num_elements());
  double* p = sum.data<double>();
  if (st_.logical_replicas() > 0 && st_.num_workers() > 1) {
    // Every logical replica's values, gathered, summed in logical order (the first copied): the
    // sum one process with all L replicas makes, whatever their mapping onto workers.
    const auto n = static_cast<int64_t>(slots_.size());
    const int64_t replicas = st_.num_replicas_in_sync();
    auto it =
        std::find_if(rows_.begin(), rows_.end(), [len](const Rows& r) { return r.len == len; });
    if (it == rows_.end()) {
      const auto l = static_cast<int64_t>(len);
      rows_.push_back(
          {len, Tensor(DType::kFloat64, Shape{n, l}), Tensor(DType::kFloat64, Shape{replicas, l})});
      it = std::prev(rows_.end());
    }
    if (!gather_) gather_ = std::make_unique<ReplicaGather>(st_);
    double* mine = it->local.data<double>();
    for (int64_t r = 0; r < n; ++r)
      std::copy(slots_[r].begin(), slots_[r].end(), mine + r * static_cast<int64_t>(len));
    gather_->gather(it->local, it->all);
    const double* all = it->all.data<double>();
    std::copy_n(all, len, p);
    for (int64_t r = 1; r < replicas; ++r) {
      for (size_t i = 0; i < len; ++i) p[i] += all[static_cast<size_t>(r) * len + i];
    }
    return;
  }
  std::copy(slots_[0].begin(), slots_[0].end(), p);
  for (size_t r = 1; r < slots_.size(); ++r) {
    for (size_t i = 0; i < len; ++i) p[i] += slots_[r][i];
  }
  if (st_.num_workers() > 1) {
    st_.all_reduce_across_workers(std::span<Tensor>(&sum, 1), ReduceOp::kSum);
  }
}

Tensor& ReplicaAllReduce::buffer(size_t n) {
  for (Tensor& t : buffers_) {
    if (t.num_elements() == static_cast<int64_t>(n)) return t;
  }
  buffers_.emplace_back(DType::kFloat64, Shape{static_cast<int64_t>(n)});
  return buffers_.back();
}

}  // namespace dtrain::distribute
