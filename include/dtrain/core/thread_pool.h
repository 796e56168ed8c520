// A fixed-size pool of worker threads with a blocking parallel_for. Used for data-parallel
// kernels and in-process replicas. Thread-safe: any thread may submit work; parallel_for
// blocks the caller until every chunk has run, and rethrows the first exception.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dtrain {

class ThreadPool {
 public:
  // Starts `num_threads` workers (0 runs everything on the calling thread).
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(threads_.size()); }

  // Runs fn(i) for i in [0, n), spreading indices over the workers and the caller.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void worker_loop();

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;  // guarded by mu_
  int64_t next_ = 0;                                  // guarded by mu_
  int64_t end_ = 0;                                   // guarded by mu_
  int64_t pending_ = 0;                               // guarded by mu_
  uint64_t generation_ = 0;                           // guarded by mu_
  std::exception_ptr error_;                          // guarded by mu_
  bool stop_ = false;                                 // guarded by mu_
};

}  // namespace dtrain
