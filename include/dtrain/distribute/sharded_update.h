// Sharded optimizer state for MultiWorkerMirroredStrategy (MultiWorkerOptions::
// shard_optimizer_state; ZeRO stages 1 and 2). The trainable variables are partitioned with
// partition_rows(shapes, num_workers) (core/partition.h, the layout sharded checkpoints use):
// worker k owns shard k's rows, and its optimizer keeps slots for those rows only.
//   stage 1: the gradients are reduce-scattered to their owners into a whole-size buffer of
//            summed gradients (only this worker's rows are written), each worker updates its rows;
//   stage 2: the same reduce-scatter, but each worker keeps only the sums of its rows (the
//            other gradient buffers are never allocated);
// then the updated rows are all-gathered, so every worker holds every variable again. Every
// element is summed in the order of the unsharded all-reduce (Collectives::summation_order) and
// every optimizer updates element-wise, so the variables are bitwise those of the unsharded step.
// Clipping by norm (clipnorm, global_clipnorm) works too: each variable's norm is summed row by
// row as the unsharded update sums it (the workers all-gather their rows' sums: one double per
// row).
//
// Used from the thread that runs fit's step; nothing else may use the collectives meanwhile.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/core/partition.h"
#include "dtrain/core/tensor.h"
#include "dtrain/distribute/collectives.h"

namespace dtrain::optim {
class Optimizer;
}

namespace dtrain::distribute {

class ShardedOptimizerUpdate {
 public:
  // `vars` (float32 trainable variables) and `extra` (float32/float64 tensors summed in place
  // with the gradients: the step's flags and moving statistics) are kept by reference. When
  // `optimizer` already holds slots for `vars` (restored from a checkpoint, an earlier fit), this
  // worker's rows are copied into its shard slots and the full slots are dropped. Throws
  // InvalidArgumentError for a stage other than 1 or 2 and what Collectives::summation_order
  // throws.
  ShardedOptimizerUpdate(Collectives& collectives, std::span<Variable* const> vars,
                         std::span<Tensor> extra, int stage, optim::Optimizer& optimizer);
  ~ShardedOptimizerUpdate();
  ShardedOptimizerUpdate(const ShardedOptimizerUpdate&) = delete;
  ShardedOptimizerUpdate& operator=(const ShardedOptimizerUpdate&) = delete;

  int stage() const { return stage_; }
  const RowPartition& partition() const { return partition_; }

  // Sums one local replica's gradients across workers (`grads`: one per variable, undefined for
  // none, or empty for a worker without rows) into this worker's shard, and `extra` in place on
  // every worker. Throws as Collectives::all_reduce.
  void reduce(std::span<const Tensor> grads);
  // Whether every worker's shard of the summed gradients is finite (a collective).
  bool all_finite();
  // Updates this worker's rows with the optimizer (slots for those rows only), then all-gathers
  // the variables.
  void apply();
  // Gives the optimizer full-size slots for the variables, holding every shard's values
  // (all-gathered), and drops the shard slots: afterwards it looks unsharded (to save it, or at
  // the end of fit). The next reduce() shards it again.
  void gather_slots();

  // Bytes this worker holds in optimizer slots for the variables, and in summed gradients
  // (stage 1: a whole-size buffer; stage 2: its rows').
  size_t slot_bytes() const;
  size_t gradient_bytes() const;

 private:
  void shard_slots();          // full slots -> this worker's shard slots
  void compute_clip_scales();  // clipping by norm: clip_scales_ of this worker's shard variables

  Collectives& collectives_;
  std::vector<Variable*> vars_;
  std::span<Tensor> extra_;
  int stage_;
  optim::Optimizer& optimizer_;
  int rank_ = 0;
  RowPartition partition_;
  std::vector<std::vector<SumRange>> order_;  // vars_ then extra_
  // This worker's rows: one variable per slice (named as the variable, so weight-decay
  // exclusions match) and its summed gradient.
  std::vector<std::unique_ptr<Variable>> shard_vars_;
  std::vector<Variable*> shard_ptrs_;
  std::vector<Tensor> shard_grads_;
  std::vector<Tensor> full_grads_;  // stage 1 only
  struct PieceTemplate {
    size_t var;
    int64_t begin;  // element offset in the variable
    size_t count;
    int owner;  // summation owner (Collectives::summation_order)
    int keep;   // partition owner (stage 2), -1 (stage 1)
    void* dst;
  };
  std::vector<PieceTemplate> templates_;
  std::vector<OrderedPiece> pieces_;
  std::vector<float> local_, flat_;              // gather_slots' buffers
  std::vector<std::span<std::byte>> var_bytes_;  // the variables' storage, apply()'s output
  std::vector<size_t> shard_bytes_;              // per rank
  bool sharded_ = false;                         // the optimizer holds shard slots (not full ones)
  // Clipping by norm only: this worker's and every row's Σ g², each row's variable, bytes of row
  // sums per rank, each variable's squared norm, each shard variable's scale.
  std::vector<double> local_rows_, all_rows_;
  std::vector<int> row_variable_;
  std::vector<size_t> row_bytes_;
  std::vector<double> squared_norms_;
  std::vector<float> clip_scales_;
};

}  // namespace dtrain::distribute
