// Sharded checkpoints under a multi-worker strategy (docs/checkpoints.md, "Sharded checkpoints"):
// the ShardedSaveOptions with which every worker of a job writes only its rows of the model's
// trainable variables and of their optimizer slots, gathering the index entries over the
// strategy's collectives. fit() uses them with FitOptions::sharded_checkpoints; programs with
// their own loop call them directly:
//
//   checkpoint::Checkpoint ckpt({{"model", model}, {"optimizer", opt}});
//   ckpt.set_sharding(train::sharded_save_options(strategy, model));
//   ckpt.save(dir + "/ckpt");  // on every worker, at the same point
#pragma once

#include <string>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/distribute/strategy.h"
#include "dtrain/nn/model.h"

namespace dtrain::train {

// Every worker's `mine`, indexed by rank, over strategy.all_gather_across_workers (two
// all-gathers: the lengths, then the bytes padded to the longest). Blocks; throws what the
// strategy's collectives throw (UnavailableError when a peer is lost, DeadlineExceededError).
std::vector<std::string> all_gather_bytes(distribute::Strategy& strategy, const std::string& mine);

// Rank and world size from `strategy`, the model's trainable variables as the partitioned list
// (the order sharded optimizer state partitions them in), all_gather_bytes, and `rows` (null:
// rows of the full tensors, as every worker holds them under a replicated strategy).
checkpoint::ShardedSaveOptions sharded_save_options(distribute::Strategy& strategy,
                                                    nn::Model& model,
                                                    checkpoint::RowSource* rows = nullptr);

}  // namespace dtrain::train
