// File utilities for crash-safe output: AtomicFile writes a file under a temporary name in the
// destination's directory, fsyncs it, renames it over the destination and fsyncs the directory,
// so a reader (or a process restarted after a crash or power loss) sees either the old file or
// the complete new one, never a prefix. Errors carry the path and strerror, mapped to dtrain's
// TensorFlow-style codes. An AtomicFile is thread-compatible; the free functions are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain {

struct AtomicFileOptions {
  bool sync = true;               // fdatasync the file before the rename and fsync the directory
                                  // after it
  bool sync_directory = true;     // with sync: fsync the directory after the rename; false when a
                                  // later rename in the same directory fsyncs it for both
  size_t buffer_size = 1u << 20;  // appends smaller than this are coalesced; larger ones go
                                  // straight to the kernel without a copy
  // An existing file in the destination's directory to overwrite as the temporary instead of
  // creating one, so that its inode and blocks are reused (on ext4 without a journal, creating
  // and deleting a file costs more kernel CPU than writing a megabyte). The AtomicFile owns it
  // from then on: commit renames it over the destination, abort deletes it. It is held with an
  // exclusive flock while it is rewritten; when it cannot be opened, or a reader holds a shared
  // flock on it, it is deleted (the reader keeps its bytes) and a new temporary is created.
  std::string reuse = {};
};

class AtomicFile {
 public:
  // Creates "<path>.tmp.<random>" next to `path` (same directory, so rename is atomic). Throws
  // NotFoundError (missing directory), PermissionDeniedError (a read-only or unwritable
  // directory), ResourceExhaustedError (ENOSPC/EDQUOT) or another Error naming the path.
  explicit AtomicFile(std::string path, AtomicFileOptions options = {});
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Discards the temporary file unless commit() succeeded; never throws.
  ~AtomicFile();

  // Appends bytes. Blocks on write(2) when the buffer fills or for a large append. Throws
  // ResourceExhaustedError on ENOSPC, EFBIG (RLIMIT_FSIZE, with SIGXFSZ ignored) or EDQUOT, and
  // an Error for other failures, naming the destination path; after a throw only the
  // destructor or abort() may be called.
  void append(const void* data, size_t n);
  void append(std::string_view s) { append(s.data(), s.size()); }
  // Bytes appended so far.
  uint64_t size() const { return size_; }

  // Flushes, fdatasyncs (options.sync), closes, renames over the destination and fsyncs the
  // directory (options.sync). Blocks for the duration of the syncs. Throws like append();
  // on failure the destination is unchanged and the temporary file is removed.
  void commit();
  // Removes the temporary file; the destination is unchanged. Idempotent; never throws.
  void abort() noexcept;

  const std::string& path() const { return path_; }
  const std::string& temp_path() const { return temp_path_; }

 private:
  void flush_buffer();
  void write_all(const void* data, size_t n);

  std::string path_;
  std::string temp_path_;
  AtomicFileOptions options_;
  int fd_ = -1;
  std::vector<char> buffer_;
  size_t buffered_ = 0;
  uint64_t size_ = 0;
  uint64_t written_ = 0;      // bytes handed to write(2)
  uint64_t writeback_ = 0;    // bytes whose writeback has been started (sync_file_range)
  int64_t reused_size_ = -1;  // the reused file's size when opened; -1: created
  bool done_ = false;
};

// Replaces `path` with `contents` through an AtomicFile. Throws like AtomicFile.
void write_file_atomically(const std::string& path, std::string_view contents,
                           AtomicFileOptions options = {});

// The whole content of `path`. Throws NotFoundError when it does not exist, another Error
// naming the path otherwise.
std::string read_file(const std::string& path);
// What is left of the open file `fd`, read to its end (the caller keeps and closes `fd`).
// Throws an Error naming `path`.
std::string read_to_end(int fd, const std::string& path);

// Reads `n` bytes of the open file `fd` at offset `at` into `into`, retrying short and
// interrupted reads. Returns the bytes read: `n`, fewer where the file ends first, or -1 (errno
// set) on an error.
int64_t pread_full(int fd, void* into, size_t n, int64_t at);

// fsyncs directory `dir` so that renames and creations in it are durable. Throws an Error
// naming the directory.
void sync_directory(const std::string& dir);

// Throws the dtrain error for `err` (an errno value) from `operation` ("open", "write", ...) on
// `path`: ENOENT → NotFoundError, ENOSPC/EFBIG/EDQUOT → ResourceExhaustedError, EACCES/EPERM/
// EROFS → PermissionDeniedError, EEXIST → AlreadyExistsError, EIO → UNAVAILABLE (as TF maps it),
// ENOTDIR/EISDIR/ENAMETOOLONG/EINVAL → InvalidArgumentError, others → UNKNOWN. The message is
// "<operation> <path>: <strerror>".
[[noreturn]] void throw_file_error(int err, std::string_view operation, const std::string& path);

}  // namespace dtrain
