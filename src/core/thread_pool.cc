// ThreadPool: one job at a time, indices handed out under a mutex.
#include "dtrain/core/thread_pool.h"

#include "dtrain/core/float_env.h"

namespace dtrain {

ThreadPool::ThreadPool(int num_threads) {
  flush_denormals_enabled();  // a malformed DTRAIN_FLUSH_DENORMALS throws before a thread starts
  for (int i = 0; i < num_threads; ++i) threads_.push_back(start_thread([this] { worker_loop(); }));
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || (generation_ != seen && next_ < end_); });
    if (stop_) return;
    seen = generation_;
    follow_flush_denormals();  // set_flush_denormals() may have changed it since the last job
    while (next_ < end_) {
      const int64_t i = next_++;
      const auto* fn = fn_;
      lock.unlock();
      std::exception_ptr err;
      try {
        (*fn)(i);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (threads_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  // One job at a time: wait for a previous caller's job to drain.
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = &fn;
  next_ = 0;
  end_ = n;
  pending_ = n;
  error_ = nullptr;
  ++generation_;
  work_cv_.notify_all();
  // The caller works too.
  while (next_ < end_) {
    const int64_t i = next_++;
    lock.unlock();
    std::exception_ptr err;
    try {
      fn(i);
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    --pending_;
  }
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
  std::exception_ptr err = error_;
  error_ = nullptr;
  done_cv_.notify_all();
  lock.unlock();
  if (err) std::rethrow_exception(err);
}

}  // namespace dtrain
