// parallel_for on libgomp's team (compiled with -fopenmp; see parallel_for.h for why OpenMP).
#include "dtrain/core/parallel_for.h"

#include <omp.h>

#include <atomic>

#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"

namespace dtrain {
namespace {

std::atomic<int> g_threads{1};

}  // namespace

void set_intra_op_threads(int n) {
  DTRAIN_CHECK(n >= 1, "set_intra_op_threads: need at least one thread, got ", n);
  g_threads.store(n, std::memory_order_relaxed);
}

int intra_op_threads() { return g_threads.load(std::memory_order_relaxed); }

namespace internal {

void parallel_for_ranges(int64_t n, int64_t grain, int threads, RangeBody body, void* ctx) {
  const int64_t blocks = (n + grain - 1) / grain;
  const int team = static_cast<int>(std::min<int64_t>(threads, blocks));
  if (team <= 1 || omp_in_parallel()) {
    body(ctx, 0, n);
    return;
  }
#pragma omp parallel num_threads(team)
  {
    // OpenMP's workers are not started by start_thread(): follow the flush-denormals setting
    // here (two register moves).
    follow_flush_denormals();
    const int64_t t = omp_get_thread_num();
    const int64_t nt = omp_get_num_threads();
    const int64_t begin = blocks * t / nt * grain;
    const int64_t end = std::min(n, blocks * (t + 1) / nt * grain);
    if (begin < end) body(ctx, begin, end);
  }
}

}  // namespace internal
}  // namespace dtrain
