// The thread's current strategy (strategy.scope()) and replica, and the reductions every
// strategy shares: fixed-order local sums split over the replica threads, then across workers.
#include "dtrain/distribute/strategy.h"

#include <algorithm>

#include "dtrain/core/error.h"
#include "dtrain/distribute/gradient_overlap.h"
#include "dtrain/distribute/sharded_update.h"
#include "dtrain/optim/optimizer.h"
#include "replica_context.h"

namespace dtrain::distribute {
namespace {
thread_local Strategy* t_current = nullptr;
thread_local int t_local_replica = -1;

bool is_float(DType d) { return d == DType::kFloat32 || d == DType::kFloat64; }

void scale_tensor(Tensor& t, double factor) {
  if (t.dtype() == DType::kFloat32) {
    float* p = t.data<float>();
    const float f = static_cast<float>(factor);
    for (int64_t i = 0, n = t.num_elements(); i < n; ++i) p[i] *= f;
  } else {
    double* p = t.data<double>();
    for (int64_t i = 0, n = t.num_elements(); i < n; ++i) p[i] *= factor;
  }
}

// out[b, e) = in[0][b, e) + in[1][b, e) + ... in replica order, skipping replicas without a
// gradient (an empty list or an undefined tensor); zeros when none has one. The first gradient is
// copied, not added to zero, so that the sum is bitwise the serial sum (also for -0.0).
template <class T>
void ordered_sum(std::span<const std::vector<Tensor>> in, size_t v, Tensor& out, int64_t b,
                 int64_t e) {
  T* o = static_cast<T*>(out.raw_data());
  bool first = true;
  for (size_t r = 0; r < in.size(); ++r) {
    if (in[r].empty() || !in[r][v].defined()) continue;
    const T* p = static_cast<const T*>(in[r][v].raw_data());
    if (first) {
      if (p != o) std::copy(p + b, p + e, o + b);
      first = false;
    } else {
      for (int64_t i = b; i < e; ++i) o[i] += p[i];
    }
  }
  if (first) std::fill(o + b, o + e, T(0));
}

}  // namespace

Strategy::ScopeGuard::ScopeGuard(Strategy* s) : previous_(t_current) { t_current = s; }
Strategy::ScopeGuard::~ScopeGuard() { t_current = previous_; }

Strategy* current_strategy() { return t_current; }
int current_local_replica() { return t_local_replica; }
void set_current_local_replica(int replica) { t_local_replica = replica; }

void Strategy::all_gather_across_workers(const Tensor& local, Tensor& out) {
  DTRAIN_CHECK(num_workers() == 1, name(), ": all_gather_across_workers is not implemented");
  DTRAIN_CHECK(out.num_elements() == local.num_elements() && out.dtype() == local.dtype(),
               "all_gather_across_workers: output ", out.to_string(0), " does not fit ",
               local.to_string(0));
  out.copy_from(local);
}

std::unique_ptr<OverlappedGradientReduction> Strategy::make_overlapped_reduction(
    std::span<Tensor> /*out*/, std::span<Tensor> /*extra*/) {
  return nullptr;
}

std::unique_ptr<ShardedOptimizerUpdate> Strategy::make_sharded_update(
    std::span<Variable* const> /*vars*/, std::span<Tensor> /*extra*/,
    optim::Optimizer& /*optimizer*/) {
  return nullptr;
}

Tensor Strategy::reduce(ReduceOp op, const PerReplica& values) {
  DTRAIN_CHECK(static_cast<int>(values.size()) == num_local_replicas(), name(), "::reduce: got ",
               values.size(), " values for ", num_local_replicas(), " local replicas");
  for (const Tensor& v : values) {
    DTRAIN_CHECK(v.defined() && v.shape() == values[0].shape() && v.dtype() == values[0].dtype(),
                 name(), "::reduce: replica values differ: ", v.to_string(0), " vs ",
                 values[0].to_string(0));
  }
  Tensor out = values[0].clone();
  if (values.size() > 1) {
    DTRAIN_CHECK(is_float(out.dtype()), name(), "::reduce: needs float32 or float64 values");
    std::vector<std::vector<Tensor>> lists;
    for (const Tensor& v : values) lists.push_back({v});
    if (out.dtype() == DType::kFloat32) {
      ordered_sum<float>(lists, 0, out, 0, out.num_elements());
    } else {
      ordered_sum<double>(lists, 0, out, 0, out.num_elements());
    }
  }
  Tensor ts[] = {out};
  all_reduce_across_workers(ts, ReduceOp::kSum);
  if (op == ReduceOp::kMean) {
    DTRAIN_CHECK(is_float(out.dtype()), name(), "::reduce: MEAN needs float values");
    scale_tensor(out, 1.0 / num_replicas_in_sync());
  }
  return out;
}

void Strategy::reduce_gradients(std::span<const std::vector<Tensor>> per_replica,
                                std::span<Tensor> out, ReduceOp op,
                                const ReduceGradientsOptions& options) {
  const int n = num_local_replicas();
  DTRAIN_CHECK(static_cast<int>(per_replica.size()) == n, name(),
               "::reduce_gradients: got gradient lists of ", per_replica.size(),
               " replicas, expected ", n);
  for (size_t v = 0; v < out.size(); ++v) {
    DTRAIN_CHECK(out[v].defined() && is_float(out[v].dtype()), name(),
                 "::reduce_gradients: output ", v, " must be a defined float tensor");
  }
  for (int r = 0; r < n; ++r) {
    if (per_replica[r].empty()) continue;  // a replica without rows
    DTRAIN_CHECK(per_replica[r].size() == out.size(), name(), "::reduce_gradients: replica ", r,
                 " has ", per_replica[r].size(), " gradients, expected ", out.size());
    for (size_t v = 0; v < out.size(); ++v) {
      const Tensor& g = per_replica[r][v];
      DTRAIN_CHECK(!g.defined() || (g.shape() == out[v].shape() && g.dtype() == out[v].dtype()),
                   name(), "::reduce_gradients: replica ", r, " gradient ", v, " is ",
                   g.to_string(0), ", expected ", out[v].to_string(0));
    }
  }
  const bool fused = options.then != nullptr && num_workers() == 1;
  struct Job {
    std::span<const std::vector<Tensor>> in;
    std::span<Tensor> out;
    int n;
    const std::function<void(int, int)>* then;
  } job{per_replica, out, n, fused ? options.then : nullptr};
  const Job* jp = &job;  // one pointer: the std::function stays in its small buffer
  auto local_sum = [jp](int r) {
    for (size_t v = 0; v < jp->out.size(); ++v) {
      const auto [b, e] = optim::Optimizer::element_range(jp->out[v].num_elements(), r, jp->n);
      if (b < e) {
        if (jp->out[v].dtype() == DType::kFloat32) {
          ordered_sum<float>(jp->in, v, jp->out[v], b, e);
        } else {
          ordered_sum<double>(jp->in, v, jp->out[v], b, e);
        }
      }
    }
    if (jp->then != nullptr) (*jp->then)(r, jp->n);
  };
  if (n == 1 && !fused) {
    local_sum(0);  // on the calling thread: no hand-off for a copy (or nothing, when aliased)
  } else {
    run(local_sum);
  }
  if (num_workers() > 1) {
    if (options.extra.empty()) {
      all_reduce_across_workers(out, ReduceOp::kSum);
    } else {
      reduce_list_.assign(out.begin(), out.end());
      reduce_list_.insert(reduce_list_.end(), options.extra.begin(), options.extra.end());
      all_reduce_across_workers(reduce_list_, ReduceOp::kSum);
      reduce_list_.clear();  // keeps no references: callers test use_count()
    }
  }
  if (op == ReduceOp::kMean) {
    for (Tensor& t : out) scale_tensor(t, 1.0 / num_replicas_in_sync());
  }
  if (options.then != nullptr && !fused) {
    if (n == 1) {
      (*options.then)(0, 1);
    } else {
      const auto* then = options.then;
      run([then, n](int r) { (*then)(r, n); });
    }
  }
}

}  // namespace dtrain::distribute
