// SummaryWriter: writes a TensorBoard event file the way tf.summary.create_file_writer does —
// a new file events.out.tfevents.<unix seconds>.<hostname>.<pid>.<counter>.v2 in `logdir`
// starting with a `brain.Event:2` record, then scalars (float32 rank-0 tensors, plugin
// "scalars"), text (string tensors, plugin "text") and histograms (plugin "histograms"). Records
// are appended with CRCs, so a crash leaves at worst a torn last record that readers detect and
// skip. Thread-safe: one mutex guards the buffer and the file; a background thread flushes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "dtrain/summary/event.h"

namespace dtrain::summary {

struct SummaryWriterOptions {
  std::string filename_suffix = "";  // appended to the file name, after ".v2"
  double flush_secs = 2;             // buffered events reach the file at most this late
  size_t max_queue = 10;             // buffered events that trigger a write at once
  bool fsync = true;                 // fsync on every flush, so flushed events survive a crash
  // What a failed write to the event file (ENOSPC, EIO, ...) does once the file exists. false:
  // the call that hit it throws (a background flush's error is thrown by the next call). true:
  // one warning on stderr ("dtrain: warning: TensorBoard: RESOURCE_EXHAUSTED: write <path>: ...")
  // and the writer stops: later events are dropped and no call throws for it, as TensorFlow's
  // summary writer logs the error and training goes on. Either way the file keeps only whole
  // records. The constructor always throws when it cannot create and start the file.
  bool warn_on_error = false;
};

class SummaryWriter {
 public:
  // Creates `logdir` (and parents) if needed and a new event file in it, writes and flushes the
  // file_version record, and starts the flush thread. Throws an Error naming the path when the
  // directory or file cannot be created or written (NotFoundError, PermissionDeniedError,
  // ResourceExhaustedError, ...); then no event file is left behind.
  explicit SummaryWriter(std::string logdir, SummaryWriterOptions options = {});
  SummaryWriter(const SummaryWriter&) = delete;
  SummaryWriter& operator=(const SummaryWriter&) = delete;
  // close(); errors are swallowed (call close() to see them).
  ~SummaryWriter();

  // Records `value` (stored as float32, as tf.summary.scalar does) for `tag` at `step`.
  // Writes to the file when max_queue events are buffered (blocking on write/fsync); throws
  // FailedPreconditionError after close(), or the error a background flush hit.
  void scalar(std::string_view tag, double value, int64_t step);
  // Records Markdown `text` for `tag` at `step` (the text plugin's rank-0 string tensor).
  // Blocks and throws like scalar().
  void text(std::string_view tag, std::string_view markdown, int64_t step);
  // Records a histogram of `values` for `tag` at `step` like tf.summary.histogram: a float64
  // tensor [buckets, 3] of (left edge, right edge, count) over [min, max]. Blocks and throws like
  // scalar(); throws InvalidArgumentError when buckets < 1.
  void histogram(std::string_view tag, std::span<const double> values, int64_t step,
                 int buckets = 30);
  // Writes a SessionLog event (START marks a restart for TensorBoard's Python loader, see
  // docs/tensorboard.md). Blocks and throws like scalar().
  void session_log(SessionStatus status, int64_t step, std::string_view message = {},
                   std::string_view checkpoint_path = {});
  // Appends `event` as given (wall_time 0 means "now"). Blocks and throws like scalar(), and
  // InvalidArgumentError when the event cannot be encoded.
  void write_event(const Event& event);

  // Writes buffered events to the file and fsyncs it (options.fsync). Blocks for the write and
  // fsync; throws an Error naming the path on I/O failure (ENOSPC: ResourceExhaustedError),
  // unless options.warn_on_error.
  void flush();
  // Flushes, stops the flush thread and closes the file. Idempotent. Throws like flush().
  void close();

  // The event file's path.
  const std::string& path() const { return path_; }

 private:
  void append_locked(std::unique_lock<std::mutex>& lock, const Event& event);
  void flush_locked();
  void write_buffer_locked();
  void check_open_locked();
  void flush_loop();

  std::string path_;
  SummaryWriterOptions options_;
  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string buffer_;  // framed records not yet written
  size_t queued_ = 0;   // events in buffer_
  double last_flush_ = 0;
  bool closed_ = false;
  bool stopped_ = false;      // a write failed under warn_on_error
  std::exception_ptr error_;  // from the flush thread, rethrown by the next call
  std::thread flusher_;
};

// The wall-clock time TensorBoard stores: seconds since the Unix epoch, with microseconds.
double wall_time_now();

}  // namespace dtrain::summary
