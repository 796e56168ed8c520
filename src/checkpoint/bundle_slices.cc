// Partitioned tensors in a bundle: reading a whole tensor or a row range assembled from its
// slices (which may lie in several data shards), and writing a sharded bundle's merged index.
#include <algorithm>
#include <cstring>

#include "bundle_index.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::checkpoint {

namespace {

struct Box {  // [lo, hi) per dimension
  std::vector<int64_t> lo, hi;
  int64_t volume() const {
    int64_t v = 1;
    for (size_t d = 0; d < lo.size(); ++d) v *= std::max<int64_t>(0, hi[d] - lo[d]);
    return v;
  }
};

Box box_of(const TensorSlice& s, const Shape& full) {
  Box b;
  for (int d = 0; d < full.rank(); ++d) {
    b.lo.push_back(s.start(d));
    b.hi.push_back(s.start(d) + s.length(d, full));
  }
  return b;
}

Box intersect(const Box& a, const Box& b) {
  Box out;
  for (size_t d = 0; d < a.lo.size(); ++d) {
    out.lo.push_back(std::max(a.lo[d], b.lo[d]));
    out.hi.push_back(std::min(a.hi[d], b.hi[d]));
  }
  return out;
}

bool empty_box(const Box& b) {
  for (size_t d = 0; d < b.lo.size(); ++d) {
    if (b.hi[d] <= b.lo[d]) return true;
  }
  return false;
}

// Copies the elements of `region` (full-tensor coordinates) from `src` (which holds box `sb`) to
// `dst` (which holds box `db`). Rank >= 1; copies runs along the last dimension.
void copy_region(const char* src, const Box& sb, char* dst, const Box& db, const Box& region,
                 size_t elem) {
  const size_t r = region.lo.size();
  std::vector<int64_t> sstride(r), dstride(r);
  int64_t ss = 1, ds = 1;
  for (size_t d = r; d-- > 0;) {
    sstride[d] = ss;
    dstride[d] = ds;
    ss *= sb.hi[d] - sb.lo[d];
    ds *= db.hi[d] - db.lo[d];
  }
  const size_t run = static_cast<size_t>(region.hi[r - 1] - region.lo[r - 1]) * elem;
  std::vector<int64_t> at(region.lo);  // the current position; the last dimension stays at lo
  for (;;) {
    int64_t so = 0, dof = 0;
    for (size_t d = 0; d < r; ++d) {
      so += (at[d] - sb.lo[d]) * sstride[d];
      dof += (at[d] - db.lo[d]) * dstride[d];
    }
    std::memcpy(dst + static_cast<size_t>(dof) * elem, src + static_cast<size_t>(so) * elem, run);
    size_t d = r - 1;
    for (;;) {
      if (d == 0) return;
      --d;
      if (++at[d] < region.hi[d]) break;
      at[d] = region.lo[d];
    }
  }
}

// True when slice `b` lies inside region `w` and its elements are one contiguous run of the
// region's row-major layout: it spans the region's whole extent in every dimension after the
// first (the row partitions sharded checkpoints write, read whole or by rows).
bool contiguous_in(const Box& b, const Box& w) {
  if (b.lo.empty() || b.lo[0] < w.lo[0] || b.hi[0] > w.hi[0]) return false;
  for (size_t d = 1; d < b.lo.size(); ++d) {
    if (b.lo[d] != w.lo[d] || b.hi[d] != w.hi[d]) return false;
  }
  return true;
}

// The element offset of contiguous slice `b` in region `w`'s row-major layout.
size_t offset_in(const Box& b, const Box& w) {
  int64_t row = 1;
  for (size_t d = 1; d < w.lo.size(); ++d) row *= w.hi[d] - w.lo[d];
  return static_cast<size_t>((b.lo[0] - w.lo[0]) * row);
}

}  // namespace

const BundleEntry& BundleReader::slice_entry(std::string_view key, const TensorSlice& slice) const {
  auto it = entries_.find(encode_tensor_name_slice(key, slice));
  if (it == entries_.end()) {
    throw DataLossError(str_cat("checkpoint index ", index_filename(prefix_),
                                ": partitioned tensor '", key, "' lists slice ", slice.to_string(),
                                " but the index has no entry for it"));
  }
  return it->second;
}

void BundleReader::read_region(std::string_view key, const BundleEntry& full,
                               const TensorSlice& region_slice, Tensor& out) const {
  const Shape& shape = full.shape;
  const Box want = box_of(region_slice, shape);
  const std::string where = str_cat("checkpoint ", prefix_, ": partitioned tensor '", key, "'");
  // Which slices hold part of the region; they must not overlap and must cover it.
  std::vector<std::pair<const TensorSlice*, Box>> parts;
  int64_t covered = 0;
  for (const TensorSlice& s : full.slices) {
    const Box b = box_of(s, shape);
    for (const auto& [other, ob] : parts) {
      if (!empty_box(intersect(b, ob))) {
        throw DataLossError(
            str_cat(where, " has overlapping slices ", other->to_string(), " and ", s.to_string()));
      }
    }
    const Box part = intersect(b, want);
    if (empty_box(part)) continue;
    covered += part.volume();
    parts.emplace_back(&s, b);
  }
  if (covered != want.volume()) {
    throw DataLossError(str_cat(where, " of shape ", shape.to_string(), ": its ",
                                full.slices.size(), " slices cover ", covered, " of the ",
                                want.volume(), " elements of ", region_slice.to_string(),
                                " (a slice is missing)"));
  }
  if (want.volume() == 0) return;
  const size_t elem = dtype_size(full.dtype);
  for (const auto& [s, b] : parts) {
    const BundleEntry& se = slice_entry(key, *s);
    if (se.dtype != full.dtype || se.shape != s->shape_in(shape)) {
      throw DataLossError(str_cat(where, ": the entry of slice ", s->to_string(), " has dtype ",
                                  dtype_name(se.dtype), " and shape ", se.shape.to_string(),
                                  ", expected ", dtype_name(full.dtype), " ",
                                  s->shape_in(shape).to_string()));
    }
    const std::string name = str_cat(key, "[", s->to_string(), "]");
    if (contiguous_in(b, want)) {  // read straight into its place: no staging copy
      read_plain_into(se, name, static_cast<char*>(out.raw_data()) + offset_in(b, want) * elem);
      continue;
    }
    const Tensor t = read_plain(se, name);
    copy_region(static_cast<const char*>(t.raw_data()), b, static_cast<char*>(out.raw_data()), want,
                intersect(b, want), elem);
  }
}

Tensor BundleReader::read_rows(std::string_view key, int64_t row_begin, int64_t row_end) const {
  const BundleEntry& e = entry(key);
  if (e.shape.rank() == 0 || row_begin < 0 || row_end < row_begin || row_end > e.shape[0]) {
    throw InvalidArgumentError(str_cat("checkpoint ", prefix_, ": rows [", row_begin, ", ", row_end,
                                       ") of tensor '", key, "' of shape ", e.shape.to_string()));
  }
  if (e.dtype == DType::kString) {
    throw InvalidArgumentError(
        str_cat("checkpoint ", prefix_, ": tensor '", key, "' holds strings; use read_strings()"));
  }
  Shape rows_shape = e.shape;
  rows_shape[0] = row_end - row_begin;
  Tensor out(e.dtype, rows_shape);
  if (!e.partitioned) {
    const Tensor all = read_plain(e, key);
    const size_t row_bytes = e.shape[0] == 0 ? 0 : all.nbytes() / static_cast<size_t>(e.shape[0]);
    std::memcpy(
        out.raw_data(),
        static_cast<const char*>(all.raw_data()) + static_cast<size_t>(row_begin) * row_bytes,
        out.nbytes());
    return out;
  }
  read_region(key, e, TensorSlice::rows(e.shape.rank(), row_begin, row_end), out);
  return out;
}

void write_bundle_index(const std::string& prefix, int num_shards, const BundleEntries& entries,
                        bool sync) {
  const std::string where = str_cat("sharded bundle ", prefix);
  DTRAIN_CHECK(num_shards >= 1, where, ": num_shards ", num_shards);
  for (const auto& [key, e] : entries) {
    DTRAIN_CHECK(!key.empty(), where, ": an entry has the empty key");
    if (e.partitioned) {
      for (const TensorSlice& s : e.slices) {
        auto it = entries.find(encode_tensor_name_slice(key, s));
        DTRAIN_CHECK(it != entries.end() && !it->second.partitioned, where,
                     ": partitioned tensor '", key, "' lists slice ", s.to_string(),
                     " but no shard wrote it");
      }
      continue;
    }
    DTRAIN_CHECK(e.shard_id >= 0 && e.shard_id < num_shards, where, ": tensor '",
                 key[0] == '\0' ? std::string("<slice>") : key, "' is in shard ", e.shard_id,
                 " of ", num_shards);
  }
  write_file_atomically(index_filename(prefix), detail::build_index(num_shards, entries, where),
                        AtomicFileOptions{.sync = sync});
}

std::string bundle_index_bytes(int num_shards, const BundleEntries& entries,
                               const std::string& where) {
  return detail::build_index(num_shards, entries, where);
}

}  // namespace dtrain::checkpoint
