// DirectoryLock.
#include "directory_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

#include "checkpoint_state.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint::detail {

namespace {

// The pid written in the lock file `fd`, or 0 when there is none (yet).
long holder_pid(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return 0;
  char* end = nullptr;
  const long pid = std::strtol(buf, &end, 10);
  return end != buf && pid > 0 ? pid : 0;
}

}  // namespace

DirectoryLock::DirectoryLock(const std::string& dir)
    : path_(join_path(dir, std::string(kLockFilename))) {
  // A releasing owner unlinks the file while it holds the lock: whoever locked the unlinked
  // inode in between sees that the name now refers to another file (or none) and tries again.
  for (int attempt = 0;; ++attempt) {
    const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) throw_file_error(errno, "create lock file", path_);
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int err = errno;
      const long pid = err == EWOULDBLOCK ? holder_pid(fd) : 0;
      ::close(fd);
      if (err != EWOULDBLOCK) throw_file_error(err, "lock", path_);
      const std::string holder = pid == 0
                                     ? std::string("another process (its pid is not written yet)")
                                 : pid == ::getpid() ? str_cat("this process (pid ", pid, ")")
                                                     : str_cat("pid ", pid);
      throw FailedPreconditionError(str_cat(
          "checkpoint directory ", dir, " is in use: ", holder, " holds its lock ", path_,
          " as the writer of its checkpoints; two jobs (or two CheckpointManagers) must not write "
          "one directory at once: stop the other one or use another directory"));
    }
    struct stat held, named;
    if (::fstat(fd, &held) == 0 && ::stat(path_.c_str(), &named) == 0 &&
        held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
      fd_ = fd;
      break;
    }
    ::close(fd);
    if (attempt >= 100) {
      throw FailedPreconditionError(str_cat("checkpoint directory ", dir, ": its lock file ", path_,
                                            " keeps being replaced while it is being locked"));
    }
  }
  // Best effort (a full disk leaves it empty): only the error message of a second writer uses it.
  const std::string pid = str_cat(::getpid(), "\n");
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    (void)::ftruncate(fd_, 0);
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  // While locked (see the constructor), and only if the name still refers to this lock.
  struct stat held, named;
  if (::fstat(fd_, &held) == 0 && ::stat(path_.c_str(), &named) == 0 &&
      held.st_dev == named.st_dev && held.st_ino == named.st_ino) {
    ::unlink(path_.c_str());
  }
  ::close(fd_);
}

}  // namespace dtrain::checkpoint::detail
