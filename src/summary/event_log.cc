// JSON-lines fault-event log (include/dtrain/summary/event_log.h).
#include "dtrain/summary/event_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::summary {

EventLog::EventLog(std::string path, EventLogOptions options)
    : path_(std::move(path)), options_(options) {
  DTRAIN_CHECK(!path_.empty(), "EventLog: path is empty");
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) throw_file_error(ec.value(), "mkdir", parent.string());
  }
  // Read access too: remove_torn_line reads the end back.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_file_error(errno, "open", path_);
}

EventLog::~EventLog() {
  if (fd_ >= 0) ::close(fd_);
}

void EventLog::append(std::string_view json_object) {
  nlohmann::json j = nlohmann::json::parse(json_object, nullptr, /*allow_exceptions=*/false);
  DTRAIN_CHECK(j.is_object(), "EventLog::append: not a JSON object: ", json_object.substr(0, 200));
  const std::string line = j.dump() + "\n";
  std::lock_guard lock(mutex_);
  // One write(2): with O_APPEND the line lands whole at the end even with other writers. A
  // regular file takes less only when it is full (or a signal interrupts): then the rest is
  // written, and when that fails the torn start of the line is removed, so that the log holds
  // whole lines only and later events still parse.
  size_t done = 0;
  while (done < line.size()) {
    const ssize_t w = ::write(fd_, line.data() + done, line.size() - done);
    if (w < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      if (done > 0) remove_torn_line(std::string_view(line).substr(0, done));
      throw_file_error(err, "write", path_);
    }
    done += static_cast<size_t>(w);
  }
  if (options_.fsync && ::fdatasync(fd_) != 0) throw_file_error(errno, "fsync", path_);
}

void EventLog::remove_torn_line(std::string_view written) {
  const off_t end = ::lseek(fd_, 0, SEEK_END);
  const auto n = static_cast<off_t>(written.size());
  if (end < n) return;
  // Only when the file still ends with these bytes (no other writer appended since).
  std::string tail(written.size(), '\0');
  if (::pread(fd_, tail.data(), tail.size(), end - n) != static_cast<ssize_t>(tail.size()) ||
      tail != written) {
    return;
  }
  [[maybe_unused]] const int rc = ::ftruncate(fd_, end - n);
}

std::vector<std::string> read_event_log(const std::string& path) {
  const std::string content = read_file(path);
  std::vector<std::string> out;
  size_t pos = 0;
  int line_no = 0;
  for (;;) {
    const size_t nl = content.find('\n', pos);
    if (nl == std::string::npos) break;  // a torn last line, or the end
    ++line_no;
    const std::string_view line(content.data() + pos, nl - pos);
    pos = nl + 1;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) {
      throw DataLossError(str_cat(path, ":", line_no, ": not a JSON object"));
    }
    out.push_back(j.dump());
  }
  return out;
}

}  // namespace dtrain::summary
