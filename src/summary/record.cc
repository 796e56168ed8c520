// TFRecord framing and a reader that tells a torn tail from corruption
// (include/dtrain/summary/record.h).
#include "dtrain/summary/record.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ios>
#include <optional>
#include <sstream>

#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::summary {
namespace {

uint32_t load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
uint64_t load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
// The size of a regular file; nullopt for anything else (a device such as /dev/zero, a pipe),
// whose end is unknown: no scan of such a file may run "to the end".
std::optional<uint64_t> regular_size(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw_file_error(errno, "stat", path);
  if (!S_ISREG(st.st_mode)) return std::nullopt;
  return static_cast<uint64_t>(st.st_size);
}

// Records longer than this are refused where the file's size cannot bound them.
constexpr uint64_t kMaxUnboundedRecord = uint64_t{1} << 34;

std::string hex(uint32_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

}  // namespace

std::string encode_record(std::string_view data) {
  std::string out;
  out.reserve(kRecordHeaderSize + data.size() + kRecordFooterSize);
  const uint64_t n = data.size();
  out.append(reinterpret_cast<const char*>(&n), 8);
  const uint32_t len_crc = crc32c::mask(crc32c::value(out.data(), 8));
  out.append(reinterpret_cast<const char*>(&len_crc), 4);
  out.append(data);
  const uint32_t data_crc = crc32c::mask(crc32c::value(data));
  out.append(reinterpret_cast<const char*>(&data_crc), 4);
  return out;
}

RecordReader::RecordReader(std::string path, RecordReaderOptions options)
    : path_(std::move(path)), options_(options) {
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw_file_error(errno, "open", path_);
  struct stat st;
  if (::fstat(fd_, &st) == 0 && S_ISDIR(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InvalidArgumentError(str_cat(path_, " is a directory, not an event file"));
  }
}

RecordReader::~RecordReader() {
  if (fd_ >= 0) ::close(fd_);
}

size_t RecordReader::pread_at(uint64_t offset, void* buf, size_t n) {
  const int64_t done = pread_full(fd_, buf, n, static_cast<int64_t>(offset));
  if (done < 0) throw_file_error(errno, "read", path_);
  return static_cast<size_t>(done);
}

uint64_t RecordReader::valid_record_at(uint64_t offset) {
  char h[kRecordHeaderSize];
  if (pread_at(offset, h, sizeof h) != sizeof h) return 0;
  if (crc32c::unmask(load32(h + 8)) != crc32c::value(h, 8)) return 0;
  const uint64_t n = load64(h);
  if (n > kMaxUnboundedRecord) return 0;
  // Only called on regular files (skip_corrupt refuses others): the record must fit in the file.
  const std::optional<uint64_t> size = regular_size(fd_, path_);
  if (!size || offset > *size || n + kRecordHeaderSize + kRecordFooterSize > *size - offset) {
    return 0;
  }
  std::string data(n + kRecordFooterSize, '\0');
  if (pread_at(offset + kRecordHeaderSize, data.data(), data.size()) != data.size()) return 0;
  if (crc32c::unmask(load32(data.data() + n)) != crc32c::value(data.data(), n)) return 0;
  return kRecordHeaderSize + n + kRecordFooterSize;
}

bool RecordReader::zero_tail() {
  // Only a regular file has a tail; a device of zeros (/dev/zero) is never "the rest of it".
  const std::optional<uint64_t> size = regular_size(fd_, path_);
  if (!size) return false;
  char buf[4096];
  for (uint64_t off = offset_; off < *size;) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(sizeof buf, *size - off));
    const size_t got = pread_at(off, buf, want);
    for (size_t i = 0; i < got; ++i) {
      if (buf[i] != 0) return false;
    }
    if (got < want) break;  // the file shrank while reading
    off += got;
  }
  return true;
}

void RecordReader::skip_corrupt(const std::string& reason) {
  const std::string where = str_cat(path_, ": record at offset ", offset_, ": ", reason);
  if (!options_.skip_corrupt) throw DataLossError(where);
  const std::optional<uint64_t> known_size = regular_size(fd_, path_);
  if (!known_size) {
    // Resynchronising scans to the end of the file: a device has none.
    throw DataLossError(str_cat(where, " (not a regular file: cannot skip to a later record)"));
  }
  // Resynchronise: the first later offset holding a record whose both CRCs verify.
  const uint64_t size = *known_size;
  uint64_t next = offset_ + 1;
  while (next + kRecordHeaderSize + kRecordFooterSize <= size && valid_record_at(next) == 0) ++next;
  if (next + kRecordHeaderSize + kRecordFooterSize > size) next = size;
  corrupt_.push_back({offset_, next - offset_, reason});
  offset_ = next;
}

bool RecordReader::read(std::string* data) {
  truncation_.clear();
  for (;;) {
    char h[kRecordHeaderSize];
    const size_t got = pread_at(offset_, h, sizeof h);
    if (got == 0) return false;
    if (got < sizeof h) {
      truncation_ = str_cat("truncated record at offset ", offset_, ": needs at least ",
                            kRecordHeaderSize, " bytes of header, file ends after ", got);
      return false;
    }
    const uint32_t stored_len_crc = crc32c::unmask(load32(h + 8));
    const uint32_t len_crc = crc32c::value(h, 8);
    if (stored_len_crc != len_crc) {
      if (zero_tail()) {
        truncation_ = str_cat("truncated record at offset ", offset_,
                              ": the rest of the file is zero bytes (a write lost in a crash)");
        return false;
      }
      const bool zeros = std::all_of(h, h + sizeof h, [](char c) { return c == 0; });
      skip_corrupt(str_cat("length CRC mismatch (stored ", hex(stored_len_crc), ", computed ",
                           hex(len_crc), ")",
                           zeros ? ": a header of zero bytes (length 0 with a zero CRC)" : ""));
      continue;
    }
    const uint64_t n = load64(h);
    const std::optional<uint64_t> size = regular_size(fd_, path_);
    if (!size && n > kMaxUnboundedRecord) {
      skip_corrupt(str_cat("record length ", n, " is implausible (more than ", kMaxUnboundedRecord,
                           " bytes)"));
      continue;
    }
    const uint64_t total = kRecordHeaderSize + n + kRecordFooterSize;
    const uint64_t left = !size ? total : *size > offset_ ? *size - offset_ : 0;
    if (n > left || total > left) {
      truncation_ = str_cat("truncated record at offset ", offset_, ": needs ", total,
                            " bytes, file ends after ", left);
      return false;
    }
    data->resize(n + kRecordFooterSize);
    if (pread_at(offset_ + kRecordHeaderSize, data->data(), data->size()) != data->size()) {
      truncation_ = str_cat("truncated record at offset ", offset_, ": file shrank while reading");
      return false;
    }
    const uint32_t stored_crc = crc32c::unmask(load32(data->data() + n));
    const uint32_t crc = crc32c::value(data->data(), n);
    data->resize(n);
    if (stored_crc != crc) {
      skip_corrupt(str_cat("data CRC mismatch (stored ", hex(stored_crc), ", computed ", hex(crc),
                           ") over ", n, " bytes"));
      continue;
    }
    record_offset_ = offset_;
    offset_ += total;
    return true;
  }
}

}  // namespace dtrain::summary
