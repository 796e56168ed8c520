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
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
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
  // One write(2): with O_APPEND the line lands whole at the end even with other writers.
  const ssize_t w = ::write(fd_, line.data(), line.size());
  if (w < 0) throw_file_error(errno, "write", path_);
  if (static_cast<size_t>(w) != line.size()) {
    throw ResourceExhaustedError(
        str_cat("write ", path_, ": short write of ", w, " of ", line.size(), " bytes"));
  }
  if (options_.fsync && ::fdatasync(fd_) != 0) throw_file_error(errno, "fsync", path_);
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
