// merge_bundles: TensorFlow's MergeBundles for dtrain's bundles. Reads each index through
// BundleReader, renames the data files, and writes the merged index (detail::build_index)
// under the options BundleWriter uses (no compression, 256 KiB blocks, restart interval 16).
#include "dtrain/checkpoint/merge_bundles.h"

#include <filesystem>
#include <map>

#include "bundle_index.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint {

void merge_bundles(std::span<const std::string> prefixes, const std::string& merged_prefix,
                   bool sync) {
  DTRAIN_CHECK(!prefixes.empty(), "merge_bundles: no bundles to merge into ", merged_prefix);
  const int n = static_cast<int>(prefixes.size());
  std::map<std::string, BundleEntry, std::less<>> merged;
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
  write_file_atomically(index_filename(merged_prefix),
                        detail::build_index(n, merged, str_cat("merge_bundles ", merged_prefix)),
                        AtomicFileOptions{.sync = sync});
  for (const std::string& p : prefixes) {
    std::error_code ec;
    std::filesystem::remove(index_filename(p), ec);
  }
}

}  // namespace dtrain::checkpoint
