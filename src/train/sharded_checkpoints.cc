// Sharded checkpoints over a strategy's collectives (dtrain/train/sharded_checkpoints.h).
#include "dtrain/train/sharded_checkpoints.h"

#include <algorithm>
#include <cstring>

#include "dtrain/core/error.h"

namespace dtrain::train {

std::vector<std::string> all_gather_bytes(distribute::Strategy& strategy, const std::string& mine) {
  const int n = strategy.num_workers();
  Tensor length = Tensor::from_vector<int64_t>({static_cast<int64_t>(mine.size())}, Shape{1});
  Tensor lengths(DType::kInt64, Shape{n, 1});
  strategy.all_gather_across_workers(length, lengths);
  const int64_t* len = lengths.data<int64_t>();
  const int64_t longest = std::max<int64_t>(1, *std::max_element(len, len + n));
  const int64_t words = (longest + 7) / 8;
  Tensor buffer = Tensor::zeros(Shape{words}, DType::kInt64);
  std::memcpy(buffer.raw_data(), mine.data(), mine.size());
  Tensor all(DType::kInt64, Shape{n, words});
  strategy.all_gather_across_workers(buffer, all);
  std::vector<std::string> out;
  const auto* bytes = static_cast<const char*>(all.raw_data());
  for (int r = 0; r < n; ++r) {
    DTRAIN_CHECK(len[r] >= 0 && len[r] <= words * 8, "all_gather_bytes: worker ", r,
                 " sent a length of ", len[r]);
    out.emplace_back(bytes + static_cast<size_t>(r * words * 8), static_cast<size_t>(len[r]));
  }
  return out;
}

checkpoint::ShardedSaveOptions sharded_save_options(distribute::Strategy& strategy,
                                                    nn::Model& model, checkpoint::RowSource* rows) {
  checkpoint::ShardedSaveOptions options{.rank = strategy.worker_rank(),
                                         .num_shards = strategy.num_workers(),
                                         .partitioned = {},
                                         .all_gather = nullptr,
                                         .rows = rows};
  for (Variable* v : model.trainable_variables()) options.partitioned.push_back(v);
  options.all_gather = [&strategy](const std::string& mine) {
    return all_gather_bytes(strategy, mine);
  };
  return options;
}

}  // namespace dtrain::train
