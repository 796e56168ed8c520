// TensorBundle V2 writer. The index is a LevelDB table built with leveldb::TableBuilder under TF's
// options (no compression, no filter, restart interval 16, 256 KiB blocks), which reproduces TF's
// .index bytes. The reader is in bundle_reader.cc.
#include "dtrain/checkpoint/tensor_bundle.h"

#include <leveldb/env.h>
#include <leveldb/options.h>
#include <leveldb/table_builder.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "bundle_index.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/core/proto_wire.h"

namespace dtrain::checkpoint {

using detail::decode_entry;
using detail::encode_entry;

namespace {

constexpr size_t kTableBlockSize = 262144;  // TF's BundleWriter/MergeBundles block size

constexpr int kTableRestartInterval = 16;
constexpr int kBundleMinConsumer = 0;          // kTensorBundleMinConsumer
constexpr size_t kCrcChunk = size_t{1} << 20;  // CRC and write large tensors in L2-sized pieces

// leveldb::WritableFile over a string: the index is small, so it is built in memory and then
// written through an AtomicFile.
class StringSink : public leveldb::WritableFile {
 public:
  leveldb::Status Append(const leveldb::Slice& data) override {
    out.append(data.data(), data.size());
    return leveldb::Status::OK();
  }
  leveldb::Status Close() override { return leveldb::Status::OK(); }
  leveldb::Status Flush() override { return leveldb::Status::OK(); }
  leveldb::Status Sync() override { return leveldb::Status::OK(); }
  std::string out;
};

std::string encode_header(int num_shards) {
  std::string out, version;
  wire::put_varint_field(out, 1, static_cast<uint64_t>(num_shards));
  // The producer version; min_consumer 0 is omitted.
  wire::put_varint_field(version, 1, detail::kBundleVersion);
  wire::put_bytes_field(out, 3, version);
  return out;
}

}  // namespace

namespace detail {

std::string build_index(int num_shards, const BundleEntries& entries, const std::string& where) {
  leveldb::Options options;
  options.compression = leveldb::kNoCompression;
  options.block_size = kTableBlockSize;
  options.block_restart_interval = kTableRestartInterval;
  options.filter_policy = nullptr;
  StringSink sink;
  leveldb::TableBuilder builder(options, &sink);
  builder.Add(leveldb::Slice(), encode_header(num_shards));
  std::string value;
  for (const auto& [key, entry] : entries) {
    value = encode_entry(entry);
    // TF's table builder flushes the block before an entry of two blocks or more.
    if (key.size() + value.size() >= 2 * kTableBlockSize) builder.Flush();
    builder.Add(key, value);
  }
  const leveldb::Status st = builder.Finish();
  if (!st.ok()) throw InternalError(str_cat(where, ": ", st.ToString()));
  return std::move(sink.out);
}

}  // namespace detail

std::string index_filename(const std::string& prefix) { return prefix + ".index"; }

std::string data_filename(const std::string& prefix, int shard, int num_shards) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), ".data-%05d-of-%05d", shard, num_shards);
  return prefix + buf;
}

// ---------------------------------------------------------------------------------------------
// BundleWriter

struct BundleWriter::Impl {
  BundleWriterOptions options;
  std::unique_ptr<AtomicFile> data;
  BundleEntries entries;
  bool finished = false;

  BundleEntry& new_entry(std::string_view key, const std::string& prefix) {
    DTRAIN_CHECK(!finished, "BundleWriter ", prefix, ": add after finish()");
    DTRAIN_CHECK(!key.empty(), "BundleWriter ", prefix,
                 ": the empty key is reserved for the bundle header");
    auto [it, inserted] = entries.try_emplace(std::string(key));
    DTRAIN_CHECK(inserted, "BundleWriter ", prefix, ": tensor '", key, "' was added twice");
    it->second.offset = static_cast<int64_t>(data->size());
    it->second.shard_id = options.shard;
    return it->second;
  }
};

BundleWriter::BundleWriter(std::string prefix, BundleWriterOptions options)
    : prefix_(std::move(prefix)), impl_(std::make_unique<Impl>()) {
  DTRAIN_CHECK(!prefix_.empty(), "BundleWriter: empty prefix");
  impl_->options = options;
  DTRAIN_CHECK(options.num_shards >= 1 && options.shard >= 0 && options.shard < options.num_shards,
               "BundleWriter ", prefix_, ": shard ", options.shard, " of ", options.num_shards);
  const std::filesystem::path parent = std::filesystem::path(prefix_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) throw_file_error(ec.value(), "create directory", parent.string());
  }
  impl_->data = std::make_unique<AtomicFile>(
      data_filename(prefix_, options.shard, options.num_shards),
      // The index's commit fsyncs the directory, which makes this file's rename durable too.
      AtomicFileOptions{.sync = options.sync,
                        .sync_directory = false,
                        .buffer_size = 256u << 10,
                        .reuse = std::move(impl_->options.reuse_data)});
}

BundleWriter::~BundleWriter() = default;

int64_t BundleWriter::data_bytes() const { return static_cast<int64_t>(impl_->data->size()); }

void BundleWriter::add(std::string_view key, const Tensor& tensor) {
  DTRAIN_CHECK(tensor.defined(), "BundleWriter ", prefix_, ": tensor '", key, "' is undefined");
  DTRAIN_CHECK(tensor.dtype() != DType::kString, "BundleWriter ", prefix_, ": use add_strings");
  BundleEntry& e = impl_->new_entry(key, prefix_);
  e.dtype = tensor.dtype();
  e.shape = tensor.shape();
  const size_t n = tensor.nbytes();
  const auto* p = static_cast<const char*>(tensor.raw_data());
  uint32_t crc = 0;
  for (size_t done = 0; done < n;) {
    const size_t chunk = std::min(kCrcChunk, n - done);
    crc = crc32c::extend(crc, p + done, chunk);
    impl_->data->append(p + done, chunk);
    done += chunk;
  }
  e.size = static_cast<int64_t>(n);
  e.masked_crc32c = crc32c::mask(crc);
}

std::pair<std::string, uint32_t> string_tensor_header(const std::vector<std::string>& values) {
  // TF's WriteStringTensor: varint64 lengths, a masked checksum of the lengths (each fed to the
  // CRC as a 4-byte LE uint32, or 8 bytes past 4 GiB), then the bytes.
  std::string header;
  uint32_t crc = 0;
  for (const std::string& s : values) {
    wire::put_varint(header, s.size());
    if (s.size() <= 0xffffffffu) {
      const uint32_t len = static_cast<uint32_t>(s.size());
      crc = crc32c::extend(crc, &len, 4);
    } else {
      const uint64_t len = s.size();
      crc = crc32c::extend(crc, &len, 8);
    }
  }
  const size_t lengths_end = header.size();
  wire::put_fixed32(header, crc32c::mask(crc));
  crc = crc32c::extend(crc, header.data() + lengths_end, 4);
  return {std::move(header), crc};
}

void BundleWriter::add_strings(std::string_view key, const std::vector<std::string>& values,
                               const Shape& shape) {
  DTRAIN_CHECK(static_cast<int64_t>(values.size()) == shape.num_elements(), "BundleWriter ",
               prefix_, ": string tensor '", key, "' has ", values.size(), " elements but shape ",
               shape.to_string());
  BundleEntry& e = impl_->new_entry(key, prefix_);
  e.dtype = DType::kString;
  e.shape = shape;
  auto [header, crc] = string_tensor_header(values);
  impl_->data->append(header);
  int64_t size = static_cast<int64_t>(header.size());
  for (const std::string& s : values) {
    crc = crc32c::extend(crc, s.data(), s.size());
    impl_->data->append(s);
    size += static_cast<int64_t>(s.size());
  }
  e.size = size;
  e.masked_crc32c = crc32c::mask(crc);
}

void BundleWriter::add_slice(std::string_view key, const Shape& full_shape,
                             const TensorSlice& slice, const Tensor& slice_tensor) {
  DTRAIN_CHECK(slice_tensor.defined() && slice_tensor.dtype() != DType::kString, "BundleWriter ",
               prefix_, ": slice of '", key, "' is undefined or holds strings");
  DTRAIN_CHECK(!key.empty() && key[0] != '\0', "BundleWriter ", prefix_,
               ": invalid name for a partitioned tensor");
  DTRAIN_CHECK(static_cast<int>(slice.extents.size()) == full_shape.rank() && full_shape.rank() > 0,
               "BundleWriter ", prefix_, ": slice ", slice.to_string(), " of '", key,
               "' does not match its shape ", full_shape.to_string());
  for (int d = 0; d < full_shape.rank(); ++d) {
    DTRAIN_CHECK(
        slice.full_at(d) || (slice.start(d) >= 0 && slice.length(d, full_shape) >= 0 &&
                             slice.start(d) + slice.length(d, full_shape) <= full_shape[d]),
        "BundleWriter ", prefix_, ": slice ", slice.to_string(), " of '", key,
        "' lies outside its shape ", full_shape.to_string());
  }
  DTRAIN_CHECK(slice.shape_in(full_shape) == slice_tensor.shape(), "BundleWriter ", prefix_,
               ": slice ", slice.to_string(), " of '", key, "' (shape ", full_shape.to_string(),
               ") needs a tensor of shape ", slice.shape_in(full_shape).to_string(), ", got ",
               slice_tensor.shape().to_string());
  auto [it, inserted] = impl_->entries.try_emplace(std::string(key));
  BundleEntry& full = it->second;
  if (!inserted) {
    DTRAIN_CHECK(full.partitioned && full.dtype == slice_tensor.dtype() && full.shape == full_shape,
                 "BundleWriter ", prefix_, ": tensor '", key,
                 "' was added before with another dtype or shape, or unpartitioned");
  }
  full.dtype = slice_tensor.dtype();
  full.shape = full_shape;
  full.partitioned = true;
  full.slices.push_back(slice);
  add(encode_tensor_name_slice(key, slice), slice_tensor);
}

BundleEntries BundleWriter::finish_shard() {
  DTRAIN_CHECK(!impl_->finished, "BundleWriter ", prefix_, ": finish_shard() called twice");
  impl_->finished = true;
  impl_->data->commit();
  return impl_->entries;
}

void BundleWriter::finish() {
  DTRAIN_CHECK(!impl_->finished, "BundleWriter ", prefix_, ": finish() called twice");
  DTRAIN_CHECK(impl_->options.num_shards == 1, "BundleWriter ", prefix_,
               ": a shard of a sharded bundle ends with finish_shard()");
  impl_->finished = true;
  impl_->data->commit();

  write_file_atomically(index_filename(prefix_),
                        detail::build_index(1, impl_->entries, str_cat("BundleWriter ", prefix_)),
                        AtomicFileOptions{.sync = impl_->options.sync,
                                          .sync_directory = impl_->options.sync_directory,
                                          .reuse = std::move(impl_->options.reuse_index)});
}

}  // namespace dtrain::checkpoint
