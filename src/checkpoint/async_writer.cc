// The async write pipeline (async_writer.h).
#include "async_writer.h"

#include <filesystem>
#include <utility>

#include "checkpoint_state.h"
#include "commit.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"

namespace dtrain::checkpoint::detail {

namespace fs = std::filesystem;

AsyncWriter::~AsyncWriter() {
  drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void AsyncWriter::reserve_slot() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    if (jobs_.size() < max_in_flight_) return;
    done_cv_.wait(lock);
  }
}

void AsyncWriter::wait_for_bytes(int64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock,
                [&] { return unwritten_bytes_ == 0 || unwritten_bytes_ + bytes <= max_bytes_; });
}

void AsyncWriter::submit(std::string prefix, int64_t bytes, std::string group,
                         std::function<void()> write, CommitFn commit) {
  auto job = std::make_unique<Job>();
  job->prefix = std::move(prefix);
  job->bytes = bytes;
  job->group = std::move(group);
  job->write = std::move(write);
  job->commit = std::move(commit);
  std::string warning;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) {
      // A failure was detected after this save's reserve_slot(): nothing after it commits.
      job->discarded = true;
      warning = str_cat("asynchronous checkpoint ", job->prefix,
                        " was discarded: an earlier asynchronous write failed (its error is "
                        "raised by the next call)");
    }
    unwritten_bytes_ += job->bytes;
    jobs_.push_back(std::move(job));
    if (idle_ == 0 && threads_.size() < max_in_flight_) {
      threads_.push_back(start_thread([this] { work(); }));
    }
    work_cv_.notify_one();
  }
  // Outside the lock: the warning handler may call back into the checkpoint.
  if (!warning.empty()) warn(warning);
}

bool AsyncWriter::writing(const std::string& prefix) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& j : jobs_) {
    if (same_path(j->prefix, prefix)) return true;
  }
  return false;
}

void AsyncWriter::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return jobs_.empty() && !committing_; });
}

std::exception_ptr AsyncWriter::take_error() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(error_, nullptr);
}

void AsyncWriter::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    Job* job = nullptr;
    for (const auto& j : jobs_) {
      if (j->state == JobState::kQueued && !j->discarded) {
        job = j.get();
        break;
      }
    }
    if (job == nullptr) {
      if (stop_) return;
      ++idle_;
      work_cv_.wait(lock);
      --idle_;
      continue;
    }
    job->state = JobState::kWriting;
    std::function<void()> write = std::move(job->write);
    lock.unlock();
    std::exception_ptr error;
    try {
      write();
    } catch (...) {
      error = std::current_exception();
    }
    write = nullptr;  // frees the snapshot
    lock.lock();
    unwritten_bytes_ -= job->bytes;
    job->bytes = 0;
    job->error = error;
    job->state = error ? JobState::kFailed : JobState::kWritten;
    commit_ready(lock);
    done_cv_.notify_all();
  }
}

void AsyncWriter::fail(std::exception_ptr error, size_t keep) {
  if (!error_) error_ = std::move(error);
  std::string discarded;
  for (size_t i = keep; i < jobs_.size(); ++i) {
    if (jobs_[i]->discarded) continue;
    jobs_[i]->discarded = true;
    discarded += str_cat(discarded.empty() ? "" : ", ", jobs_[i]->prefix);
  }
  if (!discarded.empty()) {
    warnings_.push_back(str_cat("asynchronous checkpoint(s) ", discarded,
                                " queued after a failed one were discarded (the error is "
                                "raised by the next call)"));
  }
}

void AsyncWriter::commit_ready(std::unique_lock<std::mutex>& lock) {
  if (committing_) return;
  committing_ = true;
  for (;;) {
    if (!warnings_.empty()) {
      // Emitted without the lock (the warning handler may call back into the checkpoint) but
      // before committing_ clears, so that drain() returns after them.
      std::vector<std::string> warnings = std::exchange(warnings_, {});
      lock.unlock();
      for (const std::string& w : warnings) warn(w);
      lock.lock();
      continue;
    }
    if (jobs_.empty()) break;
    Job& head = *jobs_.front();
    if (head.state == JobState::kWriting || (head.state == JobState::kQueued && !head.discarded))
      break;
    if (head.discarded) {
      const bool written = head.state == JobState::kWritten;
      const std::string prefix = head.prefix;
      if (head.state == JobState::kQueued) unwritten_bytes_ -= head.bytes;
      jobs_.pop_front();
      if (written) {
        // Never committed: remove what it wrote (index first, which makes it disappear).
        lock.unlock();
        remove_bundle_files(prefix);
        lock.lock();
      }
      continue;
    }
    if (head.state == JobState::kFailed) {
      fail(head.error, 1);
      jobs_.pop_front();
      continue;
    }
    std::vector<std::string> prefixes{head.prefix};
    size_t n = 1;
    if (!head.group.empty()) {
      while (n < jobs_.size() && jobs_[n]->state == JobState::kWritten && !jobs_[n]->discarded &&
             jobs_[n]->group == head.group) {
        prefixes.push_back(jobs_[n++]->prefix);
      }
    }
    CommitFn commit = jobs_[n - 1]->commit;
    std::exception_ptr error;
    if (commit) {
      lock.unlock();
      try {
        commit(prefixes);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
    }
    // A failed commit leaves these checkpoints' files (the state file may or may not name
    // them); nothing after them commits.
    if (error) fail(error, n);
    for (size_t i = 0; i < n; ++i) jobs_.pop_front();
  }
  committing_ = false;
  done_cv_.notify_all();
}

void AsyncWriter::remove_bundle_files(const std::string& prefix) {
  std::error_code ec;
  for (const std::string& f : {index_filename(prefix), data_filename(prefix, 0, 1)}) {
    if (fs::is_regular_file(fs::symlink_status(f, ec))) fs::remove(f, ec);
  }
}
}  // namespace dtrain::checkpoint::detail
