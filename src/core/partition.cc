#include "dtrain/core/partition.h"

#include "dtrain/core/error.h"

namespace dtrain {

RowPartition partition_rows(std::span<const Shape> shapes, int num_shards) {
  DTRAIN_CHECK(num_shards >= 1, "partition_rows: num_shards must be at least 1, got ", num_shards);
  RowPartition p;
  p.num_shards = num_shards;
  for (const Shape& s : shapes) p.total_elements += s.num_elements();
  p.shards.resize(num_shards);
  p.shard_begin.assign(num_shards + 1, p.total_elements);
  const int64_t total = p.total_elements;
  // The shard whose even share [k * total / N, (k + 1) * total / N) holds element `start`.
  auto shard_of = [&](int64_t start) {
    if (total == 0) return 0;
    return static_cast<int>((static_cast<__int128>(start) * num_shards) / total);
  };
  int64_t offset = 0;
  int next_begin = 0;  // the first shard whose shard_begin is still unset
  for (size_t v = 0; v < shapes.size(); ++v) {
    const Shape& s = shapes[v];
    const int64_t n = s.num_elements();
    if (n == 0) continue;
    const int64_t rows = s.rank() == 0 ? 1 : s[0];
    const int64_t row_size = n / rows;
    int64_t r = 0;
    while (r < rows) {
      const int k = shard_of(offset + r * row_size);
      // Rows of this variable that also start inside shard k: those before the first row
      // starting at or after the next shard's even boundary.
      int64_t end = rows;
      if (k + 1 < num_shards) {
        const int64_t boundary =  // first element index that belongs to shard k + 1
            static_cast<int64_t>((static_cast<__int128>(k + 1) * total + num_shards - 1) /
                                 num_shards);
        const int64_t rel = boundary - offset;  // > r * row_size
        const int64_t first_next = (rel + row_size - 1) / row_size;
        if (first_next < end) end = first_next;
      }
      while (next_begin <= k) p.shard_begin[next_begin++] = offset + r * row_size;
      p.shards[k].push_back(RowSlice{.variable = static_cast<int>(v),
                                     .row_begin = r,
                                     .row_end = end,
                                     .flat_begin = offset + r * row_size,
                                     .flat_end = offset + end * row_size});
      r = end;
    }
    offset += n;
  }
  return p;
}

}  // namespace dtrain
