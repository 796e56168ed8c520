// merge_bundles: TensorFlow's MergeBundles for dtrain's bundles. Reads each index through
// BundleReader, renames the data files, and writes the merged index with leveldb's TableBuilder
// under the options BundleWriter uses (no compression, 256 KiB blocks, restart interval 16).
#include "dtrain/checkpoint/merge_bundles.h"

#include <leveldb/env.h>
#include <leveldb/options.h>
#include <leveldb/table_builder.h>

#include <filesystem>
#include <map>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "proto_wire.h"

namespace dtrain::checkpoint {
namespace {

constexpr size_t kBlockSize = 262144;
constexpr int kRestartInterval = 16;

class Sink : public leveldb::WritableFile {
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
  wire::put_varint_field(version, 1, 1);  // producer 1; min_consumer 0 is omitted
  wire::put_bytes_field(out, 3, version);
  return out;
}

std::string encode_entry(const BundleEntry& e) {
  std::string out, shape, dim;
  for (int64_t d : e.shape) {
    dim.clear();
    if (d != 0) wire::put_varint_field(dim, 1, static_cast<uint64_t>(d));
    wire::put_bytes_field(shape, 2, dim);
  }
  wire::put_varint_field(out, 1, static_cast<uint64_t>(static_cast<int32_t>(e.dtype)));
  wire::put_bytes_field(out, 2, shape);
  if (e.shard_id != 0) wire::put_varint_field(out, 3, static_cast<uint64_t>(e.shard_id));
  if (e.offset != 0) wire::put_varint_field(out, 4, static_cast<uint64_t>(e.offset));
  if (e.size != 0) wire::put_varint_field(out, 5, static_cast<uint64_t>(e.size));
  if (e.masked_crc32c != 0) wire::put_fixed32_field(out, 6, e.masked_crc32c);
  return out;
}

}  // namespace

void merge_bundles(std::span<const std::string> prefixes, const std::string& merged_prefix,
                   bool sync) {
  DTRAIN_CHECK(!prefixes.empty(), "merge_bundles: no bundles to merge into ", merged_prefix);
  const int n = static_cast<int>(prefixes.size());
  std::map<std::string, BundleEntry> merged;
  for (int i = 0; i < n; ++i) {
    BundleReader reader(prefixes[static_cast<size_t>(i)]);
    DTRAIN_CHECK(reader.num_shards() == 1, "merge_bundles: ", prefixes[static_cast<size_t>(i)],
                 " has ", reader.num_shards(), " shards; only single-shard bundles merge");
    for (const std::string& key : reader.keys()) {
      BundleEntry e = reader.entry(key);
      e.shard_id = i;
      const auto [it, inserted] = merged.emplace(key, e);
      DTRAIN_CHECK(inserted, "merge_bundles: tensor '", key, "' is in two bundles (",
                   prefixes[static_cast<size_t>(it->second.shard_id)], " and ",
                   prefixes[static_cast<size_t>(i)], ")");
    }
  }
  const std::filesystem::path parent = std::filesystem::path(merged_prefix).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) throw_file_error(ec.value(), "create directory", parent.string());
  }
  for (int i = 0; i < n; ++i) {
    const std::string from = data_filename(prefixes[static_cast<size_t>(i)], 0, 1);
    const std::string to = data_filename(merged_prefix, i, n);
    std::error_code ec;
    std::filesystem::rename(from, to, ec);
    if (ec) throw_file_error(ec.value(), str_cat("rename to ", to), from);
  }
  leveldb::Options options;
  options.compression = leveldb::kNoCompression;
  options.block_size = kBlockSize;
  options.block_restart_interval = kRestartInterval;
  options.filter_policy = nullptr;
  Sink sink;
  leveldb::TableBuilder builder(options, &sink);
  builder.Add(leveldb::Slice(), encode_header(n));
  std::string value;
  for (const auto& [key, entry] : merged) {
    value = encode_entry(entry);
    if (key.size() + value.size() >= 2 * kBlockSize) builder.Flush();
    builder.Add(key, value);
  }
  const leveldb::Status st = builder.Finish();
  if (!st.ok()) throw InternalError(str_cat("merge_bundles ", merged_prefix, ": ", st.ToString()));
  write_file_atomically(index_filename(merged_prefix), sink.out, AtomicFileOptions{.sync = sync});
  for (const std::string& p : prefixes) {
    std::error_code ec;
    std::filesystem::remove(index_filename(p), ec);
  }
}

}  // namespace dtrain::checkpoint
