// The floating-point environment dtrain's kernels run in: flush-to-zero and denormals-are-zero
// (MXCSR FTZ|DAZ on x86-64, FPCR FZ on AArch64), on by default as in TensorFlow's compute
// threads. Subnormal floats cost 2-3x on Intel cores and change nothing a model learns; with the
// setting on they read and compute as zero. The control register is per thread, so every thread
// that runs kernels follows the process setting: the main thread (set before main, when the
// library loads), threads started with start_thread() (replicas, thread pools, prefetch,
// checkpoint writers), gRPC handlers (at each call) and OpenBLAS's worker pool (re-created from a
// thread that has the setting). Thread-safe.
//
//   dtrain::set_flush_denormals(false);          // exact IEEE subnormals, process-wide
//   { dtrain::ScopedFlushDenormals exact(false); /* ... */ }
//
// The process default comes from the environment variable DTRAIN_FLUSH_DENORMALS, read once:
// unset, "" or "1"/"on"/"true"/"yes": on; "0"/"off"/"false"/"no": off.
#pragma once

#include <thread>
#include <type_traits>
#include <utility>

namespace dtrain {

// The process setting: set_flush_denormals()'s last value, else DTRAIN_FLUSH_DENORMALS's.
// Throws InvalidArgumentError naming the variable and its value when DTRAIN_FLUSH_DENORMALS is
// set to anything else than the values above (then the load-time initializer left every thread
// as the hardware starts it, with exact subnormals).
bool flush_denormals_enabled();

// Sets the process setting, applies it to the calling thread and re-creates OpenBLAS's worker
// threads from this thread so that they follow (when the process uses OpenBLAS's pthreads
// build; a no-op for other BLAS). dtrain's own threads pick the setting up at their next step,
// job or call. Call it between trainings, not while another thread runs kernels: re-creating
// OpenBLAS's pool under a running GEMM is undefined.
void set_flush_denormals(bool on);

// Sets the process setting for the lifetime of the guard, then restores the previous one.
class ScopedFlushDenormals {
 public:
  explicit ScopedFlushDenormals(bool on);
  ~ScopedFlushDenormals();
  ScopedFlushDenormals(const ScopedFlushDenormals&) = delete;
  ScopedFlushDenormals& operator=(const ScopedFlushDenormals&) = delete;

 private:
  bool previous_;
};

// Whether the calling thread's control register flushes denormals (FTZ and DAZ both set on
// x86-64; FZ on AArch64). Always false on other architectures, where the setting is a no-op.
bool thread_flushes_denormals();
// Sets or clears the calling thread's flags, leaving the process setting alone.
void set_thread_flush_denormals(bool on);
// Applies the process setting to the calling thread; a no-op when DTRAIN_FLUSH_DENORMALS is
// malformed (whoever created the thread has already thrown). Cheap (two register moves): called
// at every step, pool job and gRPC call.
void follow_flush_denormals() noexcept;

// Starts a thread that runs fn() with the process setting (read here, on the calling thread:
// throws InvalidArgumentError as flush_denormals_enabled() does, before any thread starts).
// Every dtrain thread that may run kernels is started through it.
template <class Fn>
std::thread start_thread(Fn&& fn) {
  const bool flush = flush_denormals_enabled();
  return std::thread([flush, fn = std::decay_t<Fn>(std::forward<Fn>(fn))]() mutable {
    set_thread_flush_denormals(flush);
    fn();
  });
}

}  // namespace dtrain
