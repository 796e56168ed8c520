// TensorBoard event-file writer (include/dtrain/summary/summary_writer.h).
#include "dtrain/summary/summary_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/summary/record.h"

namespace dtrain::summary {
namespace {

// Distinguishes writers created by one process in the same second (TF's uid counter).
std::atomic<int> g_writer_counter{0};

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

SummaryValue tensor_value(std::string_view tag, std::string_view plugin, DataClass data_class,
                          DType dtype) {
  SummaryValue v;
  v.tag = tag;
  v.kind = ValueKind::kTensor;
  v.dtype = dtype;
  v.metadata.plugin_name = plugin;
  v.metadata.data_class = data_class;
  return v;
}

}  // namespace

double wall_time_now() {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return static_cast<double>(us) / 1e6;
}

SummaryWriter::SummaryWriter(std::string logdir, SummaryWriterOptions options)
    : options_(std::move(options)) {
  DTRAIN_CHECK(!logdir.empty(), "SummaryWriter: logdir is empty");
  DTRAIN_CHECK(options_.flush_secs > 0, "SummaryWriter: flush_secs must be > 0, got ",
               options_.flush_secs);
  std::error_code ec;
  std::filesystem::create_directories(logdir, ec);
  if (ec) throw_file_error(ec.value(), "mkdir", logdir);
  const auto seconds = static_cast<long long>(std::time(nullptr));
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", seconds);
  path_ = str_cat((std::filesystem::path(logdir) / "events.out.tfevents.").string(), stamp, ".",
                  hostname(), ".", ::getpid(), ".", g_writer_counter.fetch_add(1), ".v2",
                  options_.filename_suffix);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_file_error(errno, "open", path_);
  // TF's C++ writer stamps the file_version record with the whole seconds of the file name.
  Event version;
  version.wall_time = static_cast<double>(seconds);
  version.kind = EventKind::kFileVersion;
  version.file_version = kFileVersion;
  try {
    buffer_ = encode_record(encode_event(version));
    queued_ = 1;
    write_buffer_locked();
  } catch (...) {
    // Nothing of it was written: leave no empty or partial event file behind.
    ::close(fd_);
    fd_ = -1;
    ::unlink(path_.c_str());
    throw;
  }
  flusher_ = std::thread([this] { flush_loop(); });
}

SummaryWriter::~SummaryWriter() {
  try {
    close();
  } catch (...) {
    // Documented: the destructor swallows errors; close() reports them.
  }
}

void SummaryWriter::scalar(std::string_view tag, double value, int64_t step) {
  Event e;
  e.step = step;
  e.kind = EventKind::kSummary;
  SummaryValue v = tensor_value(tag, kScalarsPlugin, DataClass::kScalar, DType::kFloat32);
  v.numbers = {static_cast<double>(static_cast<float>(value))};
  v.value = v.numbers[0];
  e.values.push_back(std::move(v));
  write_event(e);
}

void SummaryWriter::text(std::string_view tag, std::string_view markdown, int64_t step) {
  Event e;
  e.step = step;
  e.kind = EventKind::kSummary;
  SummaryValue v = tensor_value(tag, kTextPlugin, DataClass::kTensor, DType::kString);
  v.strings = {std::string(markdown)};
  e.values.push_back(std::move(v));
  write_event(e);
}

void SummaryWriter::histogram(std::string_view tag, std::span<const double> values, int64_t step,
                              int buckets) {
  DTRAIN_CHECK(buckets >= 1, "SummaryWriter::histogram: buckets must be >= 1, got ", buckets);
  double lo = INFINITY, hi = -INFINITY;
  size_t n = 0;
  for (double x : values) {
    if (!std::isfinite(x)) continue;  // TensorBoard cannot draw them either
    lo = std::min(lo, x);
    hi = std::max(hi, x);
    ++n;
  }
  SummaryValue v = tensor_value(tag, kHistogramsPlugin, DataClass::kTensor, DType::kFloat64);
  if (n == 0) {
    v.shape = {0, 3};
  } else {
    if (lo == hi) {
      lo -= 0.5;
      hi += 0.5;
    }
    const double width = (hi - lo) / buckets;
    std::vector<double> counts(static_cast<size_t>(buckets), 0.0);
    for (double x : values) {
      if (!std::isfinite(x)) continue;
      const auto i = static_cast<int64_t>((x - lo) / width);
      counts[static_cast<size_t>(std::clamp<int64_t>(i, 0, buckets - 1))] += 1;
    }
    v.shape = {buckets, 3};
    for (int i = 0; i < buckets; ++i) {
      v.numbers.push_back(lo + width * i);
      v.numbers.push_back(i == buckets - 1 ? hi : lo + width * (i + 1));
      v.numbers.push_back(counts[static_cast<size_t>(i)]);
    }
  }
  Event e;
  e.step = step;
  e.kind = EventKind::kSummary;
  e.values.push_back(std::move(v));
  write_event(e);
}

void SummaryWriter::session_log(SessionStatus status, int64_t step, std::string_view message,
                                std::string_view checkpoint_path) {
  Event e;
  e.step = step;
  e.kind = EventKind::kSessionLog;
  e.session_status = status;
  e.message = message;
  e.checkpoint_path = checkpoint_path;
  write_event(e);
}

void SummaryWriter::write_event(const Event& event) {
  std::string record;
  if (event.wall_time == 0) {
    Event stamped = event;
    stamped.wall_time = wall_time_now();
    record = encode_record(encode_event(stamped));
  } else {
    record = encode_record(encode_event(event));
  }
  std::unique_lock lock(mutex_);
  check_open_locked();
  if (stopped_) return;  // a write failed under warn_on_error: summaries are dropped
  buffer_ += record;
  ++queued_;
  if (queued_ >= options_.max_queue || wall_time_now() - last_flush_ >= options_.flush_secs) {
    flush_locked();
  }
}

void SummaryWriter::check_open_locked() {
  if (closed_) throw FailedPreconditionError(str_cat("SummaryWriter: ", path_, " is closed"));
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    std::rethrow_exception(e);
  }
}

void SummaryWriter::flush_locked() {
  if (stopped_) return;
  if (!options_.warn_on_error) {
    write_buffer_locked();
    return;
  }
  try {
    write_buffer_locked();
  } catch (const Error& e) {
    // As TensorFlow's summary writer: report it and let training go on, without summaries.
    stopped_ = true;
    buffer_.clear();
    queued_ = 0;
    std::fprintf(stderr,
                 "dtrain: warning: TensorBoard: %s: %s; no more summaries are written to this "
                 "file, training goes on\n",
                 error_code_name(e.code()), e.what());
    std::fflush(stderr);
  }
}

void SummaryWriter::write_buffer_locked() {
  if (!buffer_.empty()) {
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t w = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        const int err = errno;
        // Drop a partial write so the file stays a clean sequence of records; the buffer is
        // kept, and the next flush tries again.
        if (done > 0) {
          const off_t end = ::lseek(fd_, 0, SEEK_END);
          if (end >= static_cast<off_t>(done)) {
            [[maybe_unused]] const int rc = ::ftruncate(fd_, end - static_cast<off_t>(done));
          }
        }
        throw_file_error(err, "write", path_);
      }
      done += static_cast<size_t>(w);
    }
    buffer_.clear();
    queued_ = 0;
    if (options_.fsync && ::fdatasync(fd_) != 0) throw_file_error(errno, "fsync", path_);
  }
  last_flush_ = wall_time_now();
}

void SummaryWriter::flush() {
  std::unique_lock lock(mutex_);
  check_open_locked();
  flush_locked();
}

void SummaryWriter::close() {
  std::unique_lock lock(mutex_);
  if (closed_) return;
  closed_ = true;
  wake_.notify_all();
  lock.unlock();
  if (flusher_.joinable()) flusher_.join();
  lock.lock();
  std::exception_ptr pending = std::exchange(error_, nullptr);
  try {
    flush_locked();
  } catch (...) {
    if (!pending) pending = std::current_exception();
  }
  if (::close(fd_) != 0 && !pending && !stopped_) {
    try {
      throw_file_error(errno, "close", path_);
    } catch (...) {
      pending = std::current_exception();
    }
  }
  fd_ = -1;
  if (pending) std::rethrow_exception(pending);
}

void SummaryWriter::flush_loop() {
  std::unique_lock lock(mutex_);
  const auto period = std::chrono::duration<double>(options_.flush_secs);
  while (!closed_) {
    wake_.wait_for(lock, period);
    if (closed_) break;
    if (!buffer_.empty() && !error_ && wall_time_now() - last_flush_ >= options_.flush_secs * 0.5) {
      try {
        flush_locked();
      } catch (...) {
        error_ = std::current_exception();
      }
    }
  }
}

}  // namespace dtrain::summary
