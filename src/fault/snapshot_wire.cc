// The launchers' snapshot transport (snapshot_wire.h), on core/tcp.h's frames.
#include "fault/snapshot_wire.h"

#include "core/tcp.h"
#include "dtrain/core/error.h"
#include "fault/launch_util.h"
#include "fault/worker_process.h"

namespace dtrain::fault {
namespace {

using tcp::Fd;

constexpr uint64_t kMaxFrame = uint64_t{64} << 30;  // a sanity bound on one length prefix

bool write_frame(int fd, std::string_view s) { return tcp::write_frame(fd, s); }
bool read_frame(int fd, std::string& s) { return tcp::read_frame(fd, s, kMaxFrame); }

bool write_files(int fd, const SnapshotFiles& files) {
  if (!write_frame(fd, std::to_string(files.size()))) return false;
  for (const auto& [name, bytes] : files) {
    if (!write_frame(fd, name) || !write_frame(fd, bytes)) return false;
  }
  return true;
}

bool read_files(int fd, SnapshotFiles& files) {
  std::string count;
  if (!read_frame(fd, count)) return false;
  const std::optional<int64_t> n = parse_int(count);
  if (!n || *n < 0 || *n > 1024) return false;
  files.resize(static_cast<size_t>(*n));
  for (auto& [name, bytes] : files) {
    if (!read_frame(fd, name) || !read_frame(fd, bytes)) return false;
  }
  return true;
}

int connect_to(const std::string& address, std::chrono::milliseconds timeout) {
  return tcp::connect_to(address, "snapshots", str_cat("agent ", address), timeout);
}

}  // namespace

SnapshotServer::SnapshotServer(const std::string& host, Put put, Get get)
    : put_(std::move(put)),
      get_(std::move(get)),
      server_(std::make_unique<tcp::Server>(host, "snapshots", std::chrono::seconds(10),
                                            [this](int fd) {
                                              try {
                                                handle(fd);
                                              } catch (const std::exception& e) {
                                                say("snapshots: a request failed: ", e.what());
                                              }
                                            })) {}

SnapshotServer::~SnapshotServer() = default;

int SnapshotServer::port() const { return server_->port(); }

void SnapshotServer::handle(int fd) {
  std::string op, key, step_text;
  if (!read_frame(fd, op) || !read_frame(fd, key) || !read_frame(fd, step_text)) return;
  const std::optional<int64_t> step = parse_int(step_text);
  if (!step) return;
  if (op == "put") {
    SnapshotFiles files;
    if (!read_files(fd, files)) return;  // incomplete: nothing is stored
    put_(key, *step, std::move(files));
    write_frame(fd, "ok");
  } else if (op == "get") {
    const std::optional<SnapshotFiles> files = get_(key, *step);
    write_files(fd, files.value_or(SnapshotFiles{}));
  }
}

void put_snapshot(const std::string& address, const std::string& key, int64_t step,
                  const SnapshotFiles& files, std::chrono::milliseconds timeout) {
  Fd conn(connect_to(address, timeout));
  std::string reply;
  if (!write_frame(conn.fd, "put") || !write_frame(conn.fd, key) ||
      !write_frame(conn.fd, std::to_string(step)) || !write_files(conn.fd, files) ||
      !read_frame(conn.fd, reply) || reply != "ok") {
    throw UnavailableError(
        str_cat("snapshots: could not send ", key, " step ", step, " to agent ", address));
  }
}

std::optional<SnapshotFiles> get_snapshot(const std::string& address, const std::string& key,
                                          int64_t step, std::chrono::milliseconds timeout) {
  Fd conn(connect_to(address, timeout));
  SnapshotFiles files;
  if (!write_frame(conn.fd, "get") || !write_frame(conn.fd, key) ||
      !write_frame(conn.fd, std::to_string(step)) || !read_files(conn.fd, files)) {
    throw UnavailableError(
        str_cat("snapshots: could not fetch ", key, " step ", step, " from agent ", address));
  }
  if (files.empty()) return std::nullopt;
  return files;
}

}  // namespace dtrain::fault
