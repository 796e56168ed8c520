// TFRecord framing, the container of TensorBoard event files: each record is
//   uint64 length | uint32 masked_crc32c(length bytes) | data[length] | uint32 masked_crc32c(data)
// all little-endian. A RecordReader tells a torn tail (the last record cut short, as a crash
// leaves it) from corruption (a CRC mismatch). encode_record is thread-safe; a RecordReader is
// thread-compatible.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace dtrain::summary {

// Bytes of framing around each record's data: 8 (length) + 4 (length CRC) + 4 (data CRC).
inline constexpr size_t kRecordHeaderSize = 12;
inline constexpr size_t kRecordFooterSize = 4;

// Frames `data` as one TFRecord.
std::string encode_record(std::string_view data);

struct RecordReaderOptions {
  bool skip_corrupt = false;  // on a CRC mismatch, skip to the next valid record instead of
                              // throwing; each skipped region is listed in corrupt_regions()
};

// A stretch of the file that was skipped because it failed its CRCs.
struct CorruptRegion {
  uint64_t offset = 0;  // where the bad record starts
  uint64_t length = 0;  // bytes skipped
  std::string reason;   // "length CRC mismatch (stored 0x..., computed 0x...)"
};

class RecordReader {
 public:
  // Opens `path`. Throws NotFoundError when it does not exist, another Error naming the path.
  explicit RecordReader(std::string path, RecordReaderOptions options = {});
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;
  ~RecordReader();

  // Reads the next record's data into `*data` and returns true. Returns false at the end of the
  // file, and also at a truncated last record or a zero-filled tail (then truncated() is true and
  // truncation() says where and how much is missing); reading again after more bytes were appended
  // resumes there. Throws DataLossError "<path>: record at offset N: data CRC mismatch (stored
  // 0x.., computed 0x..)" on corruption unless options.skip_corrupt. Blocks on file reads.
  bool read(std::string* data);

  // Offset of the record read() returned last.
  uint64_t record_offset() const { return record_offset_; }
  // Offset where the next read() starts.
  uint64_t offset() const { return offset_; }
  bool truncated() const { return !truncation_.empty(); }
  // "truncated record at offset N: needs M bytes, file ends after K" or empty.
  const std::string& truncation() const { return truncation_; }
  const std::vector<CorruptRegion>& corrupt_regions() const { return corrupt_; }
  const std::string& path() const { return path_; }

 private:
  // Reads up to n bytes at `offset`; returns how many were read.
  size_t pread_at(uint64_t offset, void* buf, size_t n);
  // Checks the record at `offset` without throwing; returns its total size or 0.
  uint64_t valid_record_at(uint64_t offset);
  void skip_corrupt(const std::string& reason);
  // True when every byte from offset_ to the end of the file is zero: what a crash leaves when
  // the file's size reached the disk but its last data did not.
  bool zero_tail();

  std::string path_;
  RecordReaderOptions options_;
  int fd_ = -1;
  uint64_t offset_ = 0;
  uint64_t record_offset_ = 0;
  std::string truncation_;
  std::vector<CorruptRegion> corrupt_;
};

}  // namespace dtrain::summary
