// DirectoryLock: the exclusive advisory lock a CheckpointManager holds on its directory for its
// lifetime, so that two jobs never write (and sweep) one checkpoint directory at once. It is a
// flock(2) on `<dir>/.dtrain.lock`, which holds the owner's pid for the error message: the
// kernel releases it when the owner dies, however it dies, so a restarted job gets it at once.
// flock locks belong to an open file description, so a second lock in the same process is
// refused too. The file is removed when the lock is released normally (a killed owner leaves it
// behind, unlocked; the next owner reuses it). Readers never take it.
#pragma once

#include <string>
#include <string_view>

namespace dtrain::checkpoint::detail {

inline constexpr std::string_view kLockFilename = ".dtrain.lock";

class DirectoryLock {
 public:
  // Takes the lock of existing directory `dir` without waiting. Throws FailedPreconditionError
  // naming the directory and the pid that holds it, or the file error of creating the lock
  // file (e.g. PERMISSION_DENIED for a read-only directory).
  explicit DirectoryLock(const std::string& dir);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace dtrain::checkpoint::detail
