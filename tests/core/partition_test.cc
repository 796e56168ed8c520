#include "dtrain/core/partition.h"

#include <gtest/gtest.h>

#include <vector>

#include "dtrain/core/error.h"

namespace dtrain {
namespace {

// Every row of every variable lies in exactly one shard, in order, and each shard's slices tile
// its flat range [shard_begin[k], shard_begin[k + 1]) with no gap.
void expect_tiles(const std::vector<Shape>& shapes, const RowPartition& p) {
  std::vector<int64_t> next_row(shapes.size(), 0);
  int64_t flat = 0;
  for (int k = 0; k < p.num_shards; ++k) {
    EXPECT_EQ(p.shard_begin[k], flat) << "shard " << k;
    for (const RowSlice& s : p.shards[k]) {
      EXPECT_EQ(s.flat_begin, flat);
      EXPECT_EQ(s.row_begin, next_row[s.variable]) << "variable " << s.variable;
      EXPECT_LT(s.row_begin, s.row_end);
      const Shape& shape = shapes[s.variable];
      const int64_t row_size = shape.rank() == 0 ? 1 : shape.num_elements() / shape[0];
      EXPECT_EQ(s.flat_end - s.flat_begin, (s.row_end - s.row_begin) * row_size);
      next_row[s.variable] = s.row_end;
      flat = s.flat_end;
    }
  }
  EXPECT_EQ(p.shard_begin[p.num_shards], flat);
  EXPECT_EQ(flat, p.total_elements);
  for (size_t v = 0; v < shapes.size(); ++v) {
    const int64_t rows = shapes[v].rank() == 0 ? 1 : shapes[v][0];
    EXPECT_EQ(next_row[v], shapes[v].num_elements() == 0 ? 0 : rows) << "variable " << v;
  }
}

TEST(PartitionRows, OneShardIsEveryVariableWhole) {
  std::vector<Shape> shapes = {Shape{784, 128}, Shape{128}, Shape{}, Shape{128, 10}};
  RowPartition p = partition_rows(shapes, 1);
  ASSERT_EQ(p.shards[0].size(), 4u);
  EXPECT_EQ(p.total_elements, 784 * 128 + 128 + 1 + 1280);
  expect_tiles(shapes, p);
}

TEST(PartitionRows, CutsAtRowsAndBalancesWithinARow) {
  std::vector<Shape> shapes = {Shape{784, 128}, Shape{128}, Shape{128, 10}, Shape{10}};
  for (int n = 1; n <= 7; ++n) {
    RowPartition p = partition_rows(shapes, n);
    expect_tiles(shapes, p);
    // Each shard holds its even share, give or take one row of the widest variable.
    for (int k = 0; k < n; ++k) {
      const double share = static_cast<double>(p.total_elements) / n;
      EXPECT_NEAR(static_cast<double>(p.shard_elements(k)), share, 128.0 + 1) << n << "/" << k;
    }
  }
  // The MLP's first kernel splits at row 392 between two shards (half the parameters).
  RowPartition two = partition_rows(shapes, 2);
  ASSERT_FALSE(two.shards[1].empty());
  EXPECT_EQ(two.shards[1][0].variable, 0);
  const int64_t total = 784 * 128 + 128 + 1280 + 10;
  EXPECT_EQ(two.shards[1][0].row_begin, (total / 2 + 127) / 128);
}

TEST(PartitionRows, MoreShardsThanRowsLeavesSomeEmpty) {
  std::vector<Shape> shapes = {Shape{}, Shape{2}};
  RowPartition p = partition_rows(shapes, 5);
  expect_tiles(shapes, p);
  int nonempty = 0;
  for (int k = 0; k < 5; ++k) nonempty += p.shards[k].empty() ? 0 : 1;
  EXPECT_EQ(nonempty, 3);
  RowPartition none = partition_rows({}, 3);
  expect_tiles({}, none);
  EXPECT_EQ(none.total_elements, 0);
}

TEST(PartitionRows, RejectsZeroShards) {
  std::vector<Shape> shapes = {Shape{3}};
  EXPECT_THROW(partition_rows(shapes, 0), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain
