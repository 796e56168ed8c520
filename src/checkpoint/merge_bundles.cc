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
  BundleEntries merged;
  for (int i = 0; i < n; ++i) {
    const std::string& prefix = prefixes[static_cast<size_t>(i)];
    BundleReader reader(prefix);
    DTRAIN_CHECK(reader.num_shards() == 1, "merge_bundles: ", prefix, " has ", reader.num_shards(),
                 " shards; only single-shard bundles merge");
    BundleEntries entries = reader.entries();
    for (auto& [key, e] : entries) {
      if (!e.partitioned) e.shard_id = i;
    }
    // A tensor partitioned across the bundles gets the union of its slices, as in TF.
    merge_bundle_entries(merged, entries,
                         str_cat("merge_bundles into ", merged_prefix, " (", prefix, ")"));
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
