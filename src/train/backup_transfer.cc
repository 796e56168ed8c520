// Peer-to-peer copies of committed backups (backup_transfer.h): plain POSIX sockets.
#include "backup_transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <regex>
#include <vector>

#include "core/tcp.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunk = size_t{1} << 20;
constexpr uint64_t kMaxName = 4096;
constexpr uint64_t kMaxFiles = 1024;

using tcp::Fd;
using tcp::read_all;
using tcp::read_some;
using tcp::read_u64;
using tcp::write_all;
using tcp::write_u64;

bool write_string(int fd, std::string_view s) { return tcp::write_frame(fd, s); }
bool read_string(int fd, std::string& s, uint64_t max) { return tcp::read_frame(fd, s, max); }

bool plain_name(const std::string& name) {
  static const std::regex ok(R"([A-Za-z0-9_][A-Za-z0-9_.-]*)");
  return name.size() < 256 && std::regex_match(name, ok);
}

// The files of backup `name` in `dir`, data shards first and the index last; empty unless there
// are an index and at least one data shard.
std::vector<std::string> backup_files(const std::string& dir, const std::string& name) {
  static const std::regex data(R"(\.data-\d{5}-of-\d{5})");
  std::vector<std::string> out;
  bool index = false;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(name, 0) != 0 || !e.is_regular_file(ec)) continue;
    const std::string suffix = n.substr(name.size());
    if (suffix == ".index") {
      index = true;
    } else if (std::regex_match(suffix, data)) {
      out.push_back(suffix);
    }
  }
  if (!index || out.empty()) return {};
  std::sort(out.begin(), out.end());
  out.push_back(".index");
  return out;
}

}  // namespace

BackupFileServer::BackupFileServer(std::string dir)
    : dir_(std::move(dir)),
      server_(std::make_unique<tcp::Server>("", "backup transfer", std::chrono::seconds(30),
                                            [this](int fd) { handle(fd); })) {}

BackupFileServer::~BackupFileServer() = default;

int BackupFileServer::port() const { return server_->port(); }

void BackupFileServer::handle(int fd) {
  std::string op, name;
  if (!read_string(fd, op, 16) || op != "get" || !read_string(fd, name, kMaxName)) return;
  const std::vector<std::string> files =
      plain_name(name) ? backup_files(dir_, name) : std::vector<std::string>{};
  if (!write_u64(fd, files.size())) return;
  std::vector<char> buf(kChunk);
  for (const std::string& suffix : files) {
    const std::string path = (fs::path(dir_) / (name + suffix)).string();
    Fd file(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st {};
    // A file that vanished meanwhile: the connection ends early, and the peer says so.
    if (file.fd < 0 || ::fstat(file.fd, &st) != 0) return;
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (!write_string(fd, suffix) || !write_u64(fd, size)) return;
    uint32_t crc = 0;
    for (uint64_t sent = 0; sent < size;) {
      const ssize_t r = ::read(file.fd, buf.data(), std::min<uint64_t>(kChunk, size - sent));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return;  // shrank meanwhile: cut off, never padded
      crc = crc32c::extend(crc, buf.data(), static_cast<size_t>(r));
      if (!write_all(fd, buf.data(), static_cast<size_t>(r))) return;
      sent += static_cast<uint64_t>(r);
    }
    if (!write_all(fd, &crc, sizeof crc)) return;
  }
}

FetchedBackup fetch_backup(const std::string& address, const std::string& peer,
                           const std::string& name, const std::string& into,
                           std::chrono::milliseconds timeout) {
  DTRAIN_CHECK(plain_name(name), "backup transfer: '", name, "' is not a plain checkpoint name");
  Fd conn(tcp::connect_to(address, "backup transfer", str_cat(peer, " at ", address), timeout));
  const auto lost = [&](const std::string& what) {
    return UnavailableError(str_cat("backup transfer: ", peer, " (", address, ") ", what,
                                    " while sending ", name, "; nothing of it was kept in ", into));
  };
  if (!write_string(conn.fd, "get") || !write_string(conn.fd, name)) {
    throw lost("closed the connection");
  }
  uint64_t count = 0;
  if (!read_u64(conn.fd, count)) throw lost("closed the connection before answering");
  if (count == 0) throw NotFoundError(str_cat("backup transfer: ", peer, " holds no ", name));
  if (count > kMaxFiles)
    throw DataLossError(
        str_cat("backup transfer: ", peer, " announced ", count, " files for ", name));
  fs::create_directories(into);
  FetchedBackup out{.prefix = (fs::path(into) / name).string(), .files = 0, .bytes = 0};
  // Every file stays a temporary until all of them arrived intact; the destructors discard them
  // otherwise.
  std::vector<std::unique_ptr<AtomicFile>> files;
  std::vector<char> buf(kChunk);
  for (uint64_t i = 0; i < count; ++i) {
    std::string suffix;
    uint64_t size = 0;
    if (!read_string(conn.fd, suffix, kMaxName) || !read_u64(conn.fd, size)) {
      throw lost(str_cat("closed the connection after ", i, " of ", count, " files"));
    }
    DTRAIN_CHECK(
        !suffix.empty() && suffix.find('/') == std::string::npos && plain_name(name + suffix),
        "backup transfer: ", peer, " sent a bad file name '", name + suffix, "'");
    const std::string file = name + suffix;
    files.push_back(std::make_unique<AtomicFile>((fs::path(into) / file).string(),
                                                 AtomicFileOptions{.sync = false}));
    uint32_t crc = 0;
    for (uint64_t got = 0; got < size;) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(kChunk, size - got));
      const size_t n = read_some(conn.fd, buf.data(), want);
      if (n > 0) {
        crc = crc32c::extend(crc, buf.data(), n);
        files.back()->append(buf.data(), n);
        got += n;
      }
      if (n < want) {
        throw lost(str_cat("closed the connection after ", got, " of ", size, " bytes of ", file));
      }
    }
    uint32_t sent_crc = 0;
    if (!read_all(conn.fd, &sent_crc, sizeof sent_crc)) {
      throw lost(str_cat("closed the connection before the checksum of ", file));
    }
    if (sent_crc != crc) {
      throw DataLossError(str_cat("backup transfer: ", file, " from ", peer, " (", address,
                                  ") fails its CRC-32C check (sent ", sent_crc, ", received bytes ",
                                  crc, "); nothing of ", name, " was kept in ", into));
    }
    out.bytes += size;
  }
  // The data shards first and the index last, so an index exists only beside complete data; a
  // commit that fails (a full disk) takes the files committed before it away again.
  std::stable_partition(files.begin(), files.end(), [](const std::unique_ptr<AtomicFile>& f) {
    return f->path().size() < 6 || f->path().compare(f->path().size() - 6, 6, ".index") != 0;
  });
  std::vector<std::string> committed;
  try {
    for (auto& f : files) {
      f->commit();
      committed.push_back(f->path());
    }
  } catch (...) {
    std::error_code ec;
    for (const std::string& path : committed) fs::remove(path, ec);
    throw;
  }
  out.files = static_cast<int>(files.size());
  return out;
}

std::string reachable_host(const std::string& service_host) {
  return tcp::reachable_host(service_host);
}

}  // namespace dtrain::train
