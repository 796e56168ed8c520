// MirroredStrategy's persistent replica threads and BLAS thread sizing; OneDeviceStrategy.
#include "dtrain/distribute/mirrored_strategy.h"

#include <chrono>

#include "dtrain/core/cpus.h"
#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"
#include "dtrain/core/random.h"
#include "dtrain/ops/gemm.h"
#include "replica_context.h"

namespace dtrain::distribute {
namespace {

// Spins for up to 100 µs until `ready()`; returns whether it became true. A step of a small
// model takes tens of microseconds, less than a futex wake-up on a VM, so a short spin before
// sleeping keeps the replicas in step.
template <class F>
bool spin_until(F&& ready) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) return false;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
}

// Replica threads beyond this only oversubscribe the cores (and each reserves a stack): a count
// above it is a mistake, refused before any thread starts.
int max_replicas() { return std::max(64, 16 * usable_cpus()); }

}  // namespace

MirroredStrategy::MirroredStrategy(int num_replicas, const MirroredOptions& options)
    : num_replicas_(num_replicas == 0 ? usable_cpus() : num_replicas) {
  DTRAIN_CHECK(num_replicas >= 0, "MirroredStrategy: num_replicas is ", num_replicas,
               ", must be >= 0 (0: one per usable CPU)");
  DTRAIN_CHECK(num_replicas_ <= max_replicas(), "MirroredStrategy: ", num_replicas_,
               " replicas is more than the ", usable_cpus(),
               " CPUs this process may use can run: at most ", max_replicas(),
               " (16 per CPU, at least 64)");
  if (options.report_tensorboard) tensorboard_logdir_ = options.logdir;
  DTRAIN_CHECK(options.blas_threads >= -1, "MirroredStrategy: blas_threads is ",
               options.blas_threads);
  if (options.blas_threads != -1) {
    previous_blas_threads_ = ops::num_threads();
    ops::set_num_threads(options.blas_threads > 0 ? options.blas_threads
                                                  : std::max(1, usable_cpus() / num_replicas_));
  }
  errors_.resize(num_replicas_);
  flush_denormals_enabled();  // a malformed DTRAIN_FLUSH_DENORMALS throws before a thread starts
  int started = 1;
  try {
    threads_.reserve(static_cast<size_t>(num_replicas_ - 1));
    for (; started < num_replicas_; ++started) {
      threads_.push_back(start_thread([this, r = started] { replica_loop(r); }));
    }
  } catch (const std::exception& e) {
    // A constructor that throws runs no destructor: stop and join the threads started so far
    // here, before the members they wait on are destroyed (destroying a condition variable with
    // waiters blocks forever; a joinable std::thread terminates the process).
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_.store(true, std::memory_order_release);
    }
    start_cv_.notify_all();
    for (auto& t : threads_) t.join();
    if (previous_blas_threads_ > 0) ops::set_num_threads(previous_blas_threads_);
    throw ResourceExhaustedError(str_cat("MirroredStrategy: cannot start the thread of replica ",
                                         started, " of ", num_replicas_, ": ", e.what(),
                                         " (too many replicas for the memory or thread limits; "
                                         "use fewer)"));
  }
}

MirroredStrategy::~MirroredStrategy() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true, std::memory_order_release);
  }
  start_cv_.notify_all();
  for (auto& t : threads_) t.join();
  if (previous_blas_threads_ > 0) ops::set_num_threads(previous_blas_threads_);
}

void MirroredStrategy::replica_loop(int replica) {
  set_current_local_replica(replica);
  ScopeGuard scope(this);
  uint64_t seen = 0;
  for (;;) {
    const auto published = [&] {
      return stop_.load(std::memory_order_acquire) ||
             generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(published)) {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, published);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    const auto* fn = fn_.load(std::memory_order_relaxed);
    follow_flush_denormals();  // set_flush_denormals() may have changed it since the last step
    set_current_replica_stream(stream_base_ < 0 ? ReplicaStream{}
                                                : ReplicaStream{stream_base_ + replica, replica});
    try {
      (*fn)(replica);
    } catch (...) {
      errors_[replica] = std::current_exception();
    }
    set_current_replica_stream({});
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Under the mutex, so that a controlling thread about to sleep cannot miss it.
      std::lock_guard<std::mutex> lock(mu_);
      done_cv_.notify_all();
    }
  }
}

void MirroredStrategy::run(const std::function<void(int local_replica)>& fn) {
  if (running_ || current_local_replica() >= 0) {
    throw FailedPreconditionError("MirroredStrategy::run: called from inside run()");
  }
  running_ = true;
  for (auto& e : errors_) e = nullptr;
  stream_base_ = num_replicas_in_sync() > 1 ? replica_id(0) : -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_.store(&fn, std::memory_order_relaxed);
    pending_.store(num_replicas_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  start_cv_.notify_all();
  set_current_local_replica(0);
  if (stream_base_ >= 0) set_current_replica_stream({stream_base_, 0});
  ScopeGuard scope(this);
  try {
    fn(0);
  } catch (...) {
    errors_[0] = std::current_exception();
  }
  set_current_replica_stream({});
  set_current_local_replica(-1);
  if (!spin_until([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_.load(std::memory_order_acquire) == 0; });
  }
  fn_.store(nullptr, std::memory_order_relaxed);
  running_ = false;
  for (auto& e : errors_) {
    if (e) std::rethrow_exception(e);
  }
}

void OneDeviceStrategy::run(const std::function<void(int local_replica)>& fn) {
  DTRAIN_CHECK(current_local_replica() < 0, "OneDeviceStrategy::run: called from inside run()");
  set_current_local_replica(0);
  ScopeGuard scope(this);
  try {
    fn(0);
  } catch (...) {
    set_current_local_replica(-1);
    throw;
  }
  set_current_local_replica(-1);
}

}  // namespace dtrain::distribute
