// Intra-op parallelism for kernels: parallel_for(n, grain, fn) splits [0, n) into contiguous
// ranges whose boundaries are multiples of `grain` and runs fn(begin, end) on each, one range per
// thread, on the calling thread and OpenMP's team (the libgomp team that oneDNN's convolutions
// run on, so the step's kernels share one set of threads; docs/decisions.md). The team has
// intra_op_threads() threads: ops::set_num_threads() sets it with OpenBLAS's and oneDNN's count.
//
// Work below two grains, one thread, or a call from inside a parallel region runs inline as
// fn(0, n): no dispatch, no allocation. Nothing is allocated per call. Results are the caller's
// to keep independent of the thread count: every index must be computed the same way whatever
// range it falls in (partition along independent axes only; reductions stay inside one index).
// fn must not throw: an exception escaping a range terminates the process (kernels report bad
// input before they split work).
//
//   parallel_for(rows, grain_for(cols), [&](int64_t begin, int64_t end) {
//     for (int64_t r = begin; r < end; ++r) normalize_row(x + r * cols, cols);
//   });
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace dtrain {

// The team size for parallel_for; n >= 1 (1: everything inline). Process-wide, thread-safe.
void set_intra_op_threads(int n);
int intra_op_threads();

// The work one range should at least hold to pay for a dispatch, in elements of the cheapest
// kernels (a relu, a copy): about 10 us of one core.
inline constexpr int64_t kParallelGrainElements = 16384;

// A grain in indices for indices that each cost about `elements_per_index` elements' work.
inline int64_t grain_for(int64_t elements_per_index) {
  return std::max<int64_t>(1, kParallelGrainElements / std::max<int64_t>(1, elements_per_index));
}

namespace internal {
using RangeBody = void (*)(void* ctx, int64_t begin, int64_t end);
// Splits [0, n) over up to `threads` threads (see parallel_for); runs inline inside a parallel
// region.
void parallel_for_ranges(int64_t n, int64_t grain, int threads, RangeBody body, void* ctx);
}  // namespace internal

template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int threads = intra_op_threads();
  if (threads <= 1 || n < 2 * grain) {
    fn(int64_t{0}, n);
    return;
  }
  using F = std::remove_reference_t<Fn>;
  internal::parallel_for_ranges(
      n, grain, threads,
      [](void* ctx, int64_t begin, int64_t end) { (*static_cast<F*>(ctx))(begin, end); },
      const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace dtrain
