// Merging TensorBundles into one multi-shard bundle, as TensorFlow's MergeBundles does after a
// sharded save (one bundle per device or parameter server): the data files are renamed to
// `<merged>.data-0000i-of-0000N`, every entry's shard_id is rewritten to its bundle's position,
// and one index with num_shards = N is written last (shared/reference/formats.md §1.1).
// A pure function of the files; thread-compatible (one merge per destination at a time).
#pragma once

#include <span>
#include <string>

namespace dtrain::checkpoint {

// Merges the single-shard bundles at `prefixes` (in order: bundle i becomes shard i) into
// `merged_prefix`, then removes their index files. Keys must be unique across the bundles.
// Crash safety: the data files are renamed first and the index is written atomically last, so
// a crash leaves no `<merged_prefix>.index` or a complete one. Throws NotFoundError (a missing
// bundle), DataLossError (a corrupt index), InvalidArgumentError (a key in two bundles, a
// bundle with several shards), and file errors naming the path. Blocks for the fsyncs when
// `sync`.
void merge_bundles(std::span<const std::string> prefixes, const std::string& merged_prefix,
                   bool sync = true);

}  // namespace dtrain::checkpoint
