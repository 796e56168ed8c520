// Peer-to-peer copies of committed backups (backup_transfer.h): plain POSIX sockets.
#include "backup_transfer.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <regex>
#include <vector>

#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

constexpr size_t kChunk = size_t{1} << 20;
constexpr uint64_t kMaxName = 4096;
constexpr uint64_t kMaxFiles = 1024;

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

void set_timeouts(int fd, std::chrono::milliseconds timeout) {
  timeval tv{.tv_sec = static_cast<time_t>(timeout.count() / 1000),
             .tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

// False on EOF or error (a timeout included).
bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// Bytes read before EOF or an error (n when complete).
size_t read_some(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

bool read_all(int fd, void* data, size_t n) { return read_some(fd, data, n) == n; }

bool write_u64(int fd, uint64_t v) { return write_all(fd, &v, sizeof v); }
bool write_string(int fd, std::string_view s) {
  return write_u64(fd, s.size()) && write_all(fd, s.data(), s.size());
}
bool read_u64(int fd, uint64_t& v) { return read_all(fd, &v, sizeof v); }
bool read_string(int fd, std::string& s, uint64_t max) {
  uint64_t n = 0;
  if (!read_u64(fd, n) || n > max) return false;
  s.resize(n);
  return read_all(fd, s.data(), n);
}

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

int connect_to(const std::string& address, const std::string& peer,
               std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    throw InvalidArgumentError(str_cat("backup transfer: bad address '", address, "' of ", peer));
  }
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr) {
    throw UnavailableError(str_cat("backup transfer: cannot resolve ", peer, " at ", address));
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  set_timeouts(fd, timeout);
  const int rc = ::connect(fd, res->ai_addr, res->ai_addrlen);
  const int err = errno;
  ::freeaddrinfo(res);
  if (rc != 0) {
    ::close(fd);
    throw UnavailableError(str_cat("backup transfer: cannot connect to ", peer, " at ", address,
                                   ": ", std::strerror(err)));
  }
  return fd;
}

}  // namespace

BackupFileServer::BackupFileServer(std::string dir) : dir_(std::move(dir)) {
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    throw UnavailableError(str_cat("backup transfer: cannot listen: ", std::strerror(err)));
  }
  socklen_t len = sizeof a;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
  if (::pipe2(wake_, O_CLOEXEC) != 0) {
    ::close(listen_fd_);
    throw UnavailableError("backup transfer: pipe failed");
  }
  thread_ = std::thread([this] { serve(); });
}

BackupFileServer::~BackupFileServer() {
  const char c = 0;
  [[maybe_unused]] ssize_t ignored = ::write(wake_[1], &c, 1);
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void BackupFileServer::serve() {
  while (true) {
    pollfd fds[2] = {{.fd = listen_fd_, .events = POLLIN, .revents = 0},
                     {.fd = wake_[0], .events = POLLIN, .revents = 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    Fd conn(fd);
    set_timeouts(fd, std::chrono::seconds(30));  // a peer that stops mid-request is dropped
    handle(fd);
  }
}

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
  Fd conn(connect_to(address, peer, timeout));
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
  if (const char* host = std::getenv("DTRAIN_HOST"); host && *host) return host;
  const std::string& host = service_host;
  if (host.empty() || host == "localhost" || host.rfind("127.", 0) == 0) return "127.0.0.1";
  in_addr peer{};
  if (::inet_pton(AF_INET, host.c_str(), &peer) != 1) return host;
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(9);
  a.sin_addr = peer;
  std::string out = "127.0.0.1";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    socklen_t len = sizeof a;
    char buf[INET_ADDRSTRLEN] = {};
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
        ::inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf) != nullptr) {
      out = buf;
    }
  }
  ::close(fd);
  return out;
}

}  // namespace dtrain::train
