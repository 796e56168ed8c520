// SpareFiles: the data and index files of checkpoints that retention dropped, kept under
// temporary names so that the next checkpoints overwrite them instead of creating new files. On
// ext4 without a journal creating and deleting a checkpoint's files costs more kernel CPU than
// writing a megabyte of tensors: each new inode scans the recently deleted ones, and each
// delete discards blocks. (The state file is not recycled: other processes poll it by name, and
// an in-place rewrite could tear what they read.) Thread-safe.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace dtrain::checkpoint::detail {

class SpareFiles {
 public:
  enum Kind { kData, kIndex, kNumKinds };

  // Keeps at most `max_per_kind` spares of each kind; more are deleted.
  explicit SpareFiles(size_t max_per_kind) : max_per_kind_(max_per_kind) {}
  // Deletes the spares nobody took.
  ~SpareFiles();
  SpareFiles(const SpareFiles&) = delete;
  SpareFiles& operator=(const SpareFiles&) = delete;

  // A spare of `kind` (the caller owns it from then on), or "" when there is none.
  std::string take(Kind kind);
  // Retires the file at `path`: renames it to "<path>.tmp.<pid>.spare<n>" (a name the manager's
  // stale-temporary sweep recognizes after a crash) and keeps it, or deletes it when `kind` has
  // enough spares or the rename fails. Returns false when `path` did not exist.
  bool retire(Kind kind, const std::string& path);

 private:
  // Keeps `path` (a spare) unless `kind` has enough; deletes it then.
  void adopt(Kind kind, std::string path);

  const size_t max_per_kind_;
  std::mutex mu_;
  std::vector<std::string> spares_[kNumKinds];
  unsigned long long counter_ = 0;
};

}  // namespace dtrain::checkpoint::detail
