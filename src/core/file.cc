// AtomicFile and small POSIX file helpers.
#include "dtrain/core/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>

#include "dtrain/core/error.h"

namespace dtrain {
namespace {

// With sync, writeback of a file's written bytes starts in pieces of this size.
constexpr uint64_t kWritebackBytes = uint64_t{8} << 20;

std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string temp_name_for(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char suffix[40];
  std::snprintf(suffix, sizeof(suffix), ".tmp.%d.%08llx%llu", static_cast<int>(getpid()),
                static_cast<unsigned long long>(rng() & 0xffffffffu),
                static_cast<unsigned long long>(counter.fetch_add(1)));
  return path + suffix;
}

}  // namespace

void throw_file_error(int err, std::string_view operation, const std::string& path) {
  const std::string msg = str_cat(operation, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      throw NotFoundError(msg);
    case ENOSPC:
    case EFBIG:
    case EDQUOT:
      throw ResourceExhaustedError(msg);
    case EACCES:
    case EPERM:
    case EROFS:
      throw PermissionDeniedError(msg);
    case EEXIST:
      throw AlreadyExistsError(msg);
    case EIO:
      throw UnavailableError(msg);
    case ENOTDIR:
    case EISDIR:
    case ENAMETOOLONG:
    case EINVAL:
      throw InvalidArgumentError(msg);
    default:
      throw Error(ErrorCode::kUnknown, msg);
  }
}

AtomicFile::AtomicFile(std::string path, AtomicFileOptions options)
    : path_(std::move(path)), options_(std::move(options)) {
  DTRAIN_CHECK(!path_.empty(), "AtomicFile: empty path");
  if (!options_.reuse.empty()) {
    // Overwritten in place from offset 0 (no O_TRUNC: that would free the blocks); commit()
    // trims what is left beyond the new size.
    fd_ = ::open(options_.reuse.c_str(), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    // Held exclusively while it is rewritten: a reader that holds it (a shared flock, see
    // BundleReader) still needs its bytes, so then it is deleted instead (the reader keeps the
    // file) and a new temporary is created.
    const bool readers = fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    if (fd_ >= 0 && !readers && ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode)) {
      temp_path_ = options_.reuse;
      reused_size_ = st.st_size;
    } else if (fd_ >= 0) {
      ::close(fd_);
      fd_ = -1;
      if (readers) ::unlink(options_.reuse.c_str());
    }
  }
  if (fd_ < 0) {
    temp_path_ = temp_name_for(path_);
    fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) throw_file_error(errno, "create", path_ + " (temporary " + temp_path_ + ")");
  }
  buffer_.resize(options_.buffer_size);
}

AtomicFile::~AtomicFile() { abort(); }

void AtomicFile::abort() noexcept {
  if (done_) return;
  done_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
}

void AtomicFile::write_all(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    // Linux caps one write at about 2 GiB; stay below it.
    const ssize_t w = ::write(fd_, p, n < (size_t{1} << 30) ? n : (size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw_file_error(errno, "write", path_);
    }
    p += w;
    n -= static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
  }
  // Start writing back what is complete, so that the disk works while the caller produces the
  // rest and commit()'s fsync waits only for the tail (dd's conv=fsync, by contrast, leaves all
  // of it to the final fsync). Errors surface in fsync; filesystems without support ignore it.
  if (options_.sync && written_ - writeback_ >= kWritebackBytes) {
    ::sync_file_range(fd_, static_cast<off_t>(writeback_),
                      static_cast<off_t>(written_ - writeback_), SYNC_FILE_RANGE_WRITE);
    writeback_ = written_;
  }
}

void AtomicFile::flush_buffer() {
  if (buffered_ == 0) return;
  write_all(buffer_.data(), buffered_);
  buffered_ = 0;
}

void AtomicFile::append(const void* data, size_t n) {
  DTRAIN_CHECK(!done_, "AtomicFile ", path_, ": append after commit or abort");
  if (n == 0) return;
  if (buffered_ + n <= buffer_.size()) {
    std::memcpy(buffer_.data() + buffered_, data, n);
    buffered_ += n;
  } else {
    flush_buffer();
    if (n < buffer_.size()) {
      std::memcpy(buffer_.data(), data, n);
      buffered_ = n;
    } else {
      write_all(data, n);
    }
  }
  size_ += n;
}

void AtomicFile::commit() {
  DTRAIN_CHECK(!done_, "AtomicFile ", path_, ": commit after commit or abort");
  try {
    flush_buffer();
    if (reused_size_ > static_cast<int64_t>(size_) &&
        ::ftruncate(fd_, static_cast<off_t>(size_)) != 0) {
      throw_file_error(errno, "truncate", path_ + " (temporary " + temp_path_ + ")");
    }
    // fdatasync: the data and the metadata needed to read it back (size, block map); the name
    // becomes durable with the directory's fsync after the rename.
    if (options_.sync && ::fdatasync(fd_) != 0) throw_file_error(errno, "fdatasync", path_);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_file_error(errno, "close", path_);
    if (::rename(temp_path_.c_str(), path_.c_str()) != 0) {
      throw_file_error(errno, "rename " + temp_path_ + " to", path_);
    }
  } catch (...) {
    abort();
    throw;
  }
  done_ = true;
  if (options_.sync && options_.sync_directory) sync_directory(directory_of(path_));
}

void write_file_atomically(const std::string& path, std::string_view contents,
                           AtomicFileOptions options) {
  options.buffer_size = 0;  // one write straight from `contents`
  AtomicFile f(path, std::move(options));
  f.append(contents);
  f.commit();
}

std::string read_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw_file_error(errno, "open", path);
  try {
    std::string out = read_to_end(fd, path);
    ::close(fd);
    return out;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::string read_to_end(int fd, const std::string& path) {
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw_file_error(errno, "read", path);
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  return out;
}

int64_t pread_full(int fd, void* into, size_t n, int64_t at) {
  auto* p = static_cast<char*>(into);
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(at + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<int64_t>(done);
}

void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_file_error(errno, "open directory", dir);
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    // Some filesystems cannot fsync a directory; the rename is still atomic there.
    if (err == EINVAL || err == EROFS) return;
    throw_file_error(err, "fsync directory", dir);
  }
  ::close(fd);
}

}  // namespace dtrain
