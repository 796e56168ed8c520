// The async write pipeline of Checkpoint (CheckpointOptions::enable_async; private to the
// checkpoint layer). Snapshots are queued in save order, written concurrently by up to
// max_in_flight writer threads (so that their fsync latencies overlap), and committed strictly
// in save order: whichever writer finds the oldest pending job written commits it, together
// with the written jobs right behind it that share its commit group (one state-file write for
// all of them). A failed write or commit is kept for the submitting thread to rethrow once;
// every job queued after it is discarded (never committed; files already written are removed).
// Thread-safe; one thread submits.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dtrain::checkpoint::detail {

class AsyncWriter {
 public:
  using CommitFn = std::function<void(const std::vector<std::string>&)>;

  AsyncWriter(int max_in_flight, int64_t max_bytes)
      : max_in_flight_(static_cast<size_t>(max_in_flight)), max_bytes_(max_bytes) {}
  // Waits for the pending jobs (their errors stay unreported), then stops the threads.
  ~AsyncWriter();
  AsyncWriter(const AsyncWriter&) = delete;
  AsyncWriter& operator=(const AsyncWriter&) = delete;

  // Blocks until fewer than max_in_flight jobs are pending. Rethrows a detected error first
  // (once), so that a save after a failed one fails before changing anything.
  void reserve_slot();

  // Blocks until `bytes` more of unwritten snapshots fit the budget (always, when none is
  // pending).
  void wait_for_bytes(int64_t bytes);

  // Queues a job: `write` writes `prefix` durably (it owns the snapshot), then `commit`, if any,
  // commits it. Never blocks on I/O.
  void submit(std::string prefix, int64_t bytes, std::string group, std::function<void()> write,
              CommitFn commit);

  // Whether a pending job writes `prefix`.
  bool writing(const std::string& prefix) const;

  // Blocks until every submitted job is committed or discarded. Does not throw.
  void drain();

  // The detected, unreported error (cleared), or null.
  std::exception_ptr take_error();

 private:
  enum class JobState { kQueued, kWriting, kWritten, kFailed };
  struct Job {
    std::string prefix;
    int64_t bytes = 0;  // of its snapshot, until written
    std::string group;  // consecutive written jobs of one non-empty group commit together
    std::function<void()> write;
    CommitFn commit;
    JobState state = JobState::kQueued;
    bool discarded = false;
    std::exception_ptr error;
  };

  // A writer thread: writes queued jobs until stop_.
  void work();

  // Marks the failure (the first one is reported) and discards every job after the first
  // `keep` ones.
  void fail(std::exception_ptr error, size_t keep);

  // Commits written jobs from the head of the queue, in order, until it reaches one that is
  // not written yet. One thread at a time; the lock is released around file operations.
  void commit_ready(std::unique_lock<std::mutex>& lock);

  // Removes what a discarded job wrote (index first, which makes it disappear).
  static void remove_bundle_files(const std::string& prefix);

  const size_t max_in_flight_;
  const int64_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;        // writers: a job was queued, or stop
  std::condition_variable done_cv_;        // submitter: a job was written, committed or discarded
  std::deque<std::unique_ptr<Job>> jobs_;  // pending (not yet committed), in save order
  int64_t unwritten_bytes_ = 0;            // snapshot bytes of jobs not yet written
  bool committing_ = false;                // a writer is running commit_ready
  bool stop_ = false;
  size_t idle_ = 0;  // writer threads waiting for a job
  std::vector<std::thread> threads_;
  std::exception_ptr error_;           // the first detected failure, not yet reported
  std::vector<std::string> warnings_;  // found under the lock, emitted after releasing it
};

}  // namespace dtrain::checkpoint::detail
