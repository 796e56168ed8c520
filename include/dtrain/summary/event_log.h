// EventLog: a JSON-lines log of fault events (failures, detections, restarts, recoveries), one
// JSON object per line, appended with O_APPEND in a single write(2) per event so several
// processes may share one log. Thread-safe (one mutex).
#pragma once

#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::summary {

struct EventLogOptions {
  bool fsync = false;  // fdatasync after every event, so it survives a machine crash
};

class EventLog {
 public:
  // Opens `path` for appending, creating it and its parent directories. Throws an Error naming
  // the path when it cannot.
  explicit EventLog(std::string path, EventLogOptions options = {});
  EventLog(const EventLog&) = delete;
  EventLog& operator=(const EventLog&) = delete;
  ~EventLog();

  // Appends `json_object` (re-serialized compactly, on one line). Throws InvalidArgumentError
  // when it is not one JSON object, an Error naming the path on I/O failure
  // (ResourceExhaustedError for a full disk, PermissionDeniedError, ...); a line that did not
  // fit is removed again, so the log holds whole lines only. Blocks on write (and fdatasync
  // with options.fsync).
  void append(std::string_view json_object);

  const std::string& path() const { return path_; }

 private:
  // Truncates the `written` start of a line from the end of the file, if it is still there.
  void remove_torn_line(std::string_view written);

  std::string path_;
  EventLogOptions options_;
  int fd_ = -1;
  std::mutex mutex_;
};

// The JSON objects of a JSON-lines log, in order, re-serialized compactly. A last line without
// its newline (torn by a crash) is ignored. Throws NotFoundError, or DataLossError naming the
// line number of a complete line that is not a JSON object.
std::vector<std::string> read_event_log(const std::string& path);

}  // namespace dtrain::summary
