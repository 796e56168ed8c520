// TensorBundle V2 reader (dtrain/checkpoint/tensor_bundle.h): the index through leveldb::Table,
// which also decompresses snappy blocks and verifies every block checksum; each tensor with one
// pread, checked against its CRC-32C. The writer is in tensor_bundle.cc.
#include <fcntl.h>
#include <leveldb/env.h>
#include <leveldb/iterator.h>
#include <leveldb/options.h>
#include <leveldb/table.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "bundle_index.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/core/proto_wire.h"

namespace dtrain::checkpoint {

using detail::decode_entry;

namespace {

// LevelDB's Table::Open allocates the index and meta-index blocks at the sizes the footer gives
// before it reads them, and the footer has no checksum: a corrupt footer could ask for
// terabytes (std::bad_alloc) or gigabytes of memory. Both blocks, with their 5-byte trailers,
// must lie inside the file. (The blocks the index then names are checksummed with it.)
void check_index_footer(std::string_view index, const std::string& index_path) {
  constexpr size_t kFooter = 48, kTrailer = 5;
  if (index.size() < kFooter) return;  // Table::Open reports the truncation itself
  std::string_view footer = index.substr(index.size() - kFooter);
  const auto varint = [&footer](uint64_t& v) {
    v = 0;
    for (int shift = 0; shift <= 63 && !footer.empty(); shift += 7) {
      const auto byte = static_cast<uint8_t>(footer.front());
      footer.remove_prefix(1);
      v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  };
  for (const char* block : {"meta-index", "index"}) {
    uint64_t offset = 0, size = 0;
    if (!varint(offset) || !varint(size)) return;  // Table::Open reports a bad footer
    const uint64_t room = index.size() - kFooter;
    if (offset > room || size > room - offset || kTrailer > room - offset - size) {
      throw DataLossError(str_cat("checkpoint index ", index_path,
                                  " is corrupt: its footer puts the ", block, " block at [", offset,
                                  ", +", size, ") in a file of ", index.size(), " bytes"));
    }
  }
}

// How a reader holds a checkpoint file against recycling (CheckpointManager::recycle_files: a
// writer overwriting a dropped checkpoint's file holds an exclusive flock on it and skips files
// on which someone holds a shared one).
enum class Hold {
  kHeld,         // shared lock taken and `path` still names the file: its bytes cannot change
  kRecycled,     // being overwritten now, or no longer under its name: do not trust it
  kUnprotected,  // the filesystem has no flock: nothing is known
};

Hold hold_file(int fd, const std::string& path) {
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    return errno == EWOULDBLOCK ? Hold::kRecycled : Hold::kUnprotected;
  }
  struct stat opened, named;
  if (::fstat(fd, &opened) != 0 || ::stat(path.c_str(), &named) != 0 ||
      opened.st_dev != named.st_dev || opened.st_ino != named.st_ino) {
    return Hold::kRecycled;
  }
  return Hold::kHeld;
}

[[noreturn]] void throw_recycled(const std::string& path) {
  throw AbortedError(str_cat("checkpoint file ", path,
                             " was dropped and is being reused by its CheckpointManager; restore a "
                             "newer checkpoint (restore_latest retries)"));
}

// leveldb::RandomAccessFile over the index bytes in memory.
class StringSource : public leveldb::RandomAccessFile {
 public:
  explicit StringSource(std::string_view s) : s_(s) {}
  leveldb::Status Read(uint64_t offset, size_t n, leveldb::Slice* result,
                       char* /*scratch*/) const override {
    if (offset > s_.size()) return leveldb::Status::IOError("read past the end of the index");
    n = std::min(n, s_.size() - static_cast<size_t>(offset));
    *result = leveldb::Slice(s_.data() + offset, n);
    return leveldb::Status::OK();
  }

 private:
  std::string_view s_;
};

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

void byte_swap(void* data, size_t elem, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  for (size_t i = 0; i < n; ++i, p += elem) std::reverse(p, p + elem);
}

}  // namespace

BundleReader::BundleReader(std::string prefix) : prefix_(std::move(prefix)) {
  const std::string index_path = index_filename(prefix_);
  // Each file is held (hold_file) before it is read; the index only while it is read into
  // memory, the data shards for this reader's lifetime.
  std::string index;
  {
    const int fd = ::open(index_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw_file_error(errno, "open", index_path);  // NotFoundError when absent
    const Hold hold = hold_file(fd, index_path);
    struct stat st_buf;
    if (hold == Hold::kRecycled || ::fstat(fd, &st_buf) != 0) {
      ::close(fd);
      throw_recycled(index_path);
    }
    protected_ = hold == Hold::kHeld;
    file_ids_.emplace_back(st_buf.st_dev, st_buf.st_ino);
    try {
      index = read_to_end(fd, index_path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  parse_index(index, index_path);
  // Open every shard and check that each entry lies inside it, so that a truncated data file is
  // reported now, naming the first tensor it cut.
  std::vector<int64_t> sizes;
  for (int s = 0; s < num_shards_; ++s) {
    const std::string path = data_filename(prefix_, s, num_shards_);
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      close_shards();
      throw DataLossError(str_cat("checkpoint ", prefix_, ": data file ", path,
                                  " cannot be opened: ", std::strerror(err)));
    }
    fds_.push_back(fd);
    const Hold hold = hold_file(fd, path);
    if (hold == Hold::kRecycled) {
      close_shards();
      throw_recycled(path);
    }
    protected_ = protected_ && hold == Hold::kHeld;
    struct stat st_buf;
    if (::fstat(fd, &st_buf) == 0) {
      sizes.push_back(static_cast<int64_t>(st_buf.st_size));
      file_ids_.emplace_back(st_buf.st_dev, st_buf.st_ino);
    } else {
      sizes.push_back(0);
    }
  }
  try {
    check_extents(sizes);
  } catch (...) {
    close_shards();
    throw;
  }
}

BundleReader::BundleReader(std::string prefix, BundleBytes bytes)
    : prefix_(std::move(prefix)), protected_(true) {
  const std::string index_path = index_filename(prefix_);
  parse_index(bytes.index, index_path);
  if (static_cast<int>(bytes.shards.size()) != num_shards_) {
    throw DataLossError(str_cat("checkpoint ", prefix_, " has ", bytes.shards.size(),
                                " data shard(s) in memory; its index names ", num_shards_));
  }
  std::vector<int64_t> sizes;
  for (const std::string_view shard : bytes.shards)
    sizes.push_back(static_cast<int64_t>(shard.size()));
  bytes_ = std::move(bytes);
  check_extents(sizes);
}

void BundleReader::parse_index(std::string_view index, const std::string& index_path) {
  check_index_footer(index, index_path);
  StringSource source(index);
  leveldb::Options options;
  options.paranoid_checks = true;  // verify the index block's checksum at open
  leveldb::Table* raw_table = nullptr;
  leveldb::Status st = leveldb::Table::Open(options, &source, index.size(), &raw_table);
  if (!st.ok()) {
    throw DataLossError(str_cat("checkpoint index ", index_path, " is corrupt or truncated (",
                                index.size(), " bytes): ", st.ToString()));
  }
  std::unique_ptr<leveldb::Table> table(raw_table);
  leveldb::ReadOptions read_options;
  read_options.verify_checksums = true;
  read_options.fill_cache = false;
  std::unique_ptr<leveldb::Iterator> it(table->NewIterator(read_options));
  bool have_header = false;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    const std::string key = it->key().ToString();
    const std::string_view value(it->value().data(), it->value().size());
    if (key.empty()) {
      wire::Reader r(value, str_cat("BundleHeaderProto in ", index_path));
      wire::Field f;
      while (r.next(f)) {
        if (f.number == 1) num_shards_ = static_cast<int>(f.value);
        if (f.number == 2 && f.value != 0) {
          big_endian_ = true;
        }
        if (f.number == 3) {
          wire::Reader vr(f.bytes, str_cat("VersionDef in ", index_path));
          wire::Field vf;
          while (vr.next(vf)) {
            if (vf.number == 2 && static_cast<int64_t>(vf.value) > detail::kBundleVersion) {
              throw UnimplementedError(str_cat("checkpoint index ", index_path,
                                               " needs a newer reader (min_consumer ", vf.value,
                                               ")"));
            }
          }
        }
      }
      have_header = true;
      continue;
    }
    BundleEntry e = decode_entry(value, str_cat("BundleEntryProto of '", key, "' in ", index_path));
    if (key[0] != '\0') names_.push_back(key);  // slice entries start with NUL (OrderedCode 0)
    entries_.emplace(key, std::move(e));
  }
  if (!it->status().ok()) {
    throw DataLossError(
        str_cat("checkpoint index ", index_path, " is corrupt: ", it->status().ToString()));
  }
  if (!have_header) {
    throw DataLossError(str_cat("checkpoint index ", index_path, " has no bundle header"));
  }
  if (num_shards_ < 1 || num_shards_ > 100000) {
    throw DataLossError(
        str_cat("checkpoint index ", index_path, " has an invalid num_shards ", num_shards_));
  }
}

void BundleReader::check_extents(const std::vector<int64_t>& sizes) const {
  const std::string index_path = index_filename(prefix_);
  for (const auto& [key, e] : entries_) {
    if (e.partitioned) continue;
    if (e.shard_id < 0 || e.shard_id >= num_shards_ || e.offset < 0 || e.size < 0) {
      throw DataLossError(str_cat("checkpoint index ", index_path, ": tensor '", key,
                                  "' has an invalid location (shard ", e.shard_id, ", offset ",
                                  e.offset, ", size ", e.size, ")"));
    }
    // (offset and size are each at most INT64_MAX: their sum could overflow)
    if (e.size > sizes[static_cast<size_t>(e.shard_id)] - e.offset) {
      throw DataLossError(str_cat(
          "checkpoint data file ", data_filename(prefix_, e.shard_id, num_shards_),
          " is truncated: it has ", sizes[static_cast<size_t>(e.shard_id)], " bytes but tensor '",
          key, "' occupies bytes [", e.offset, ", ", e.offset + e.size, ")"));
    }
  }
}

BundleReader::~BundleReader() { close_shards(); }

void BundleReader::close_shards() {
  for (int fd : fds_) ::close(fd);
  fds_.clear();
}

bool BundleReader::files_replaced() const {
  if (protected_) return false;  // held since before they were read: unchanged
  if (file_ids_.size() != fds_.size() + 1) return true;  // a stat failed: cannot tell
  for (size_t i = 0; i < file_ids_.size(); ++i) {
    const std::string path = i == 0 ? index_filename(prefix_)
                                    : data_filename(prefix_, static_cast<int>(i - 1), num_shards_);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return true;
    if (static_cast<uint64_t>(st.st_dev) != file_ids_[i].first ||
        static_cast<uint64_t>(st.st_ino) != file_ids_[i].second) {
      return true;
    }
  }
  return false;
}

std::vector<std::string> BundleReader::keys() const { return names_; }

bool BundleReader::contains(std::string_view key) const {
  return !key.empty() && key[0] != '\0' && entries_.count(key) != 0;
}

const BundleEntry& BundleReader::entry(std::string_view key) const {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    throw NotFoundError(
        str_cat("key '", key, "' not found in checkpoint ", index_filename(prefix_)));
  }
  return it->second;
}

void BundleReader::read_bytes(const BundleEntry& e, std::string_view key, void* dst) const {
  if (bytes_) {  // inside its shard: check_extents
    const std::string_view shard = bytes_->shards[static_cast<size_t>(e.shard_id)];
    std::memcpy(dst, shard.data() + e.offset, static_cast<size_t>(e.size));
    return;
  }
  const std::string path = data_filename(prefix_, e.shard_id, num_shards_);
  const int fd = fds_[static_cast<size_t>(e.shard_id)];
  const int64_t got = pread_full(fd, dst, static_cast<size_t>(e.size), e.offset);
  if (got < 0) throw_file_error(errno, str_cat("read tensor '", key, "' from"), path);
  if (got < e.size) {
    throw DataLossError(str_cat("checkpoint data file ", path, " is truncated: tensor '", key,
                                "' occupies bytes [", e.offset, ", ", e.offset + e.size,
                                ") but the file ends at ", e.offset + got));
  }
}

Tensor BundleReader::read(std::string_view key) const {
  const BundleEntry& e = entry(key);
  if (e.dtype == DType::kString) {
    throw InvalidArgumentError(
        str_cat("checkpoint ", prefix_, ": tensor '", key, "' holds strings; use read_strings()"));
  }
  if (!e.partitioned) return read_plain(e, key);
  TensorSlice all;
  all.extents.resize(static_cast<size_t>(e.shape.rank()));
  Tensor out(e.dtype, e.shape);
  read_region(key, e, all, out);
  return out;
}

void BundleReader::read_plain_into(const BundleEntry& e, std::string_view key, void* dst) const {
  const std::string path = data_filename(prefix_, e.shard_id, num_shards_);
  if (e.dtype == DType::kString) {
    throw InvalidArgumentError(
        str_cat("checkpoint ", prefix_, ": tensor '", key, "' holds strings; use read_strings()"));
  }
  const size_t elem = dtype_size(e.dtype);
  if (elem == 0) {
    throw UnimplementedError(str_cat("checkpoint ", prefix_, ": tensor '", key, "' has dtype ",
                                     static_cast<int>(e.dtype),
                                     " (TF DataType enum), which dtrain does not support"));
  }
  const int64_t expected = e.shape.num_elements() * static_cast<int64_t>(elem);
  if (expected != e.size) {
    throw DataLossError(str_cat("checkpoint index ", index_filename(prefix_), ": tensor '", key,
                                "' of dtype ", dtype_name(e.dtype), " and shape ",
                                e.shape.to_string(), " needs ", expected,
                                " bytes but its entry says ", e.size));
  }
  read_bytes(e, key, dst);
  const uint32_t crc = crc32c::value(dst, static_cast<size_t>(e.size));
  if (crc != crc32c::unmask(e.masked_crc32c)) {
    throw DataLossError(str_cat("checkpoint data file ", path, ": tensor '", key, "' (bytes [",
                                e.offset, ", ", e.offset + e.size, ")) fails its CRC32C check (",
                                hex32(crc), ", index says ", hex32(crc32c::unmask(e.masked_crc32c)),
                                "): the checkpoint is corrupt"));
  }
  if (big_endian_ && elem > 1) {
    byte_swap(dst, elem, static_cast<size_t>(e.shape.num_elements()));
  }
}

Tensor BundleReader::read_plain(const BundleEntry& e, std::string_view key) const {
  Tensor t(e.dtype, e.shape);
  read_plain_into(e, key, t.raw_data());
  return t;
}

std::vector<std::string> BundleReader::read_strings(std::string_view key) const {
  const BundleEntry& e = entry(key);
  const std::string path = data_filename(prefix_, e.shard_id, num_shards_);
  if (e.dtype != DType::kString) {
    throw InvalidArgumentError(str_cat("checkpoint ", prefix_, ": tensor '", key, "' has dtype ",
                                       dtype_name(e.dtype), ", not string"));
  }
  if (e.partitioned) {
    throw UnimplementedError(str_cat("checkpoint ", prefix_, ": string tensor '", key,
                                     "' is partitioned into slices, which dtrain cannot read"));
  }
  std::string buf(static_cast<size_t>(e.size), '\0');
  read_bytes(e, key, buf.data());
  auto corrupt = [&](const std::string& why) {
    return DataLossError(str_cat("checkpoint data file ", path, ": string tensor '", key,
                                 "' (bytes [", e.offset, ", ", e.offset + e.size, ")) ", why,
                                 ": the checkpoint is corrupt"));
  };
  const int64_t n = e.shape.num_elements();
  const char* p = buf.data();
  const char* end = p + buf.size();
  std::vector<uint64_t> lengths(static_cast<size_t>(n));
  uint32_t crc = 0;
  for (auto& len : lengths) {
    if (!wire::get_varint(p, end, &len)) throw corrupt("has a malformed length");
    if (len <= 0xffffffffu) {
      const uint32_t l32 = static_cast<uint32_t>(len);
      crc = crc32c::extend(crc, &l32, 4);
    } else {
      crc = crc32c::extend(crc, &len, 8);
    }
  }
  if (end - p < 4) throw corrupt("ends inside its header");
  uint32_t stored = 0;
  std::memcpy(&stored, p, 4);
  if (crc32c::unmask(stored) != crc) throw corrupt("fails its length checksum");
  crc = crc32c::extend(crc, p, 4);
  p += 4;
  std::vector<std::string> out;
  out.reserve(lengths.size());
  for (uint64_t len : lengths) {
    if (static_cast<uint64_t>(end - p) < len) throw corrupt("is shorter than its lengths say");
    crc = crc32c::extend(crc, p, len);
    out.emplace_back(p, len);
    p += len;
  }
  if (crc != crc32c::unmask(e.masked_crc32c)) {
    throw corrupt(str_cat("fails its CRC32C check (", hex32(crc), ", index says ",
                          hex32(crc32c::unmask(e.masked_crc32c)), ")"));
  }
  return out;
}

}  // namespace dtrain::checkpoint
