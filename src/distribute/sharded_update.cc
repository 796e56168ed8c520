// ShardedOptimizerUpdate: partition_rows shards, the summation order of the unsharded
// all-reduce intersected with them, shard slots, the all-gather of the updated rows.
#include "dtrain/distribute/sharded_update.h"

#include <cmath>
#include <cstring>

#include "dtrain/core/error.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::distribute {
namespace {

int64_t rows_of(const Shape& s) { return s.rank() == 0 ? 1 : s[0]; }

Shape rows_shape(const Shape& s, int64_t rows) {
  return s.rank() == 0 ? s : s.without_first().with_first(rows);
}

// Rows [s.row_begin, s.row_end) of `t`, a view of its buffer (a scalar: all of it).
Tensor rows_view(const Tensor& t, const RowSlice& s) {
  return t.rank() == 0 ? t.reshape(t.shape()) : t.slice(s.row_begin, s.row_end);
}

}  // namespace

ShardedOptimizerUpdate::ShardedOptimizerUpdate(Collectives& collectives,
                                               std::span<Variable* const> vars,
                                               std::span<Tensor> extra, int stage,
                                               optim::Optimizer& optimizer)
    : collectives_(collectives),
      vars_(vars.begin(), vars.end()),
      extra_(extra),
      stage_(stage),
      optimizer_(optimizer),
      rank_(collectives.rank()) {
  DTRAIN_CHECK(stage == 1 || stage == 2, "shard_optimizer_state: stage ", stage,
               " is not supported (1 or 2; 0 turns sharding off)");
  std::vector<Shape> shapes;
  std::vector<Tensor> all;
  for (Variable* v : vars_) {
    DTRAIN_CHECK(v != nullptr && v->dtype() == DType::kFloat32,
                 "shard_optimizer_state: the trainable variables must be float32");
    shapes.push_back(v->shape());
    all.push_back(v->tensor());
  }
  for (const Tensor& t : extra) all.push_back(t);
  order_ = collectives.summation_order(all);
  const int n = collectives.size();
  partition_ = partition_rows(shapes, n);

  if (stage_ == 1) {
    for (Variable* v : vars_) full_grads_.push_back(Tensor(v->shape()));
  }
  // The shard variables are views of this worker's rows of the variables: the optimizer updates
  // them in place, and apply() all-gathers the other workers' rows around them.
  for (const RowSlice& s : partition_.shards[rank_]) {
    Variable& v = *vars_[s.variable];
    const Shape shape = rows_shape(v.shape(), s.row_end - s.row_begin);
    auto shard = std::make_unique<Variable>(v.name(), rows_view(v.tensor(), s), /*trainable=*/true);
    shard_ptrs_.push_back(shard.get());
    shard_vars_.push_back(std::move(shard));
    // Stage 1 holds the whole sum: the shard's gradient is a view of its rows there.
    shard_grads_.push_back(stage_ == 1 && v.shape().rank() >= 1
                               ? full_grads_[s.variable].slice(s.row_begin, s.row_end)
                               : Tensor(shape));
  }
  // Which shard (and which of this worker's slices) holds each element range of each variable.
  struct Part {
    int64_t begin, end;  // elements of the variable
    int shard;
    int mine;  // index into shard_grads_, or -1
  };
  std::vector<std::vector<Part>> parts(vars_.size());
  for (int k = 0; k < n; ++k) {
    int mine = 0;
    for (const RowSlice& s : partition_.shards[k]) {
      const Shape& shape = vars_[s.variable]->shape();
      const int64_t row = shape.num_elements() / std::max<int64_t>(1, rows_of(shape));
      parts[s.variable].push_back(
          {s.row_begin * row, s.row_end * row, k, k == rank_ ? mine++ : -1});
    }
  }
  for (size_t v = 0; v < vars_.size(); ++v) {
    for (const SumRange& r : order_[v]) {
      for (const Part& p : parts[v]) {
        const int64_t b = std::max(r.begin, p.begin), e = std::min(r.end, p.end);
        if (b >= e) continue;
        // Both stages reduce-scatter: only the owner of a row needs its sum (stage 1 keeps it in
        // its rows of the whole-size buffer; summing every row everywhere, as an all-reduce
        // does, cost stage 1 the plain step's reduction and the all-gather on top).
        void* dst = nullptr;
        if (p.mine >= 0) {
          dst = stage_ == 1 ? full_grads_[v].data<float>() + b
                            : shard_grads_[p.mine].data<float>() + (b - p.begin);
        }
        templates_.push_back({.var = v,
                              .begin = b,
                              .count = static_cast<size_t>(e - b),
                              .owner = r.owner,
                              .keep = p.shard,
                              .dst = dst});
      }
    }
  }
  for (int k = 0; k < n; ++k) {
    shard_bytes_.push_back(static_cast<size_t>(partition_.shard_elements(k)) * sizeof(float));
  }
  local_.resize(partition_.shard_elements(rank_));
  flat_.resize(partition_.total_elements);
  var_bytes_.resize(vars_.size());
  if (optimizer.clipping().by_norm()) {
    // The shards' row sums of squares, gathered in rank order: shards are consecutive rows, so
    // that is every variable's rows in order (row_variable_: whose row each one is).
    for (int k = 0; k < n; ++k) {
      size_t rows = 0;
      for (const RowSlice& s : partition_.shards[k]) {
        rows += static_cast<size_t>(s.row_end - s.row_begin);
        if (k == rank_) local_rows_.resize(local_rows_.size() + (s.row_end - s.row_begin));
        row_variable_.insert(row_variable_.end(), s.row_end - s.row_begin, s.variable);
      }
      row_bytes_.push_back(rows * sizeof(double));
    }
    all_rows_.resize(row_variable_.size());
    squared_norms_.resize(vars_.size());
    clip_scales_.resize(shard_ptrs_.size());
  }
  shard_slots();
}

ShardedOptimizerUpdate::~ShardedOptimizerUpdate() {
  // The optimizer must not keep slots of variables that die with this object.
  if (sharded_) optimizer_.drop_slots(shard_ptrs_);
}

void ShardedOptimizerUpdate::shard_slots() {
  const std::vector<std::string> names = optimizer_.slot_names();
  optimizer_.build(shard_ptrs_);
  const bool full =
      !vars_.empty() && !names.empty() && optimizer_.slot(*vars_[0], names[0]) != nullptr;
  if (full) {
    const std::vector<RowSlice>& mine = partition_.shards[rank_];
    for (size_t i = 0; i < mine.size(); ++i) {
      const Variable& v = *vars_[mine[i].variable];
      const int64_t row = v.shape().num_elements() / std::max<int64_t>(1, rows_of(v.shape()));
      for (const std::string& name : names) {
        const Variable* from = optimizer_.slot(v, name);
        Variable* to = optimizer_.slot(*shard_ptrs_[i], name);
        DTRAIN_INTERNAL_CHECK(from != nullptr && to != nullptr);
        std::memcpy(to->tensor().data<float>(),
                    from->tensor().data<float>() + mine[i].row_begin * row, to->tensor().nbytes());
      }
    }
    optimizer_.drop_slots(vars_);
  }
  sharded_ = true;
}

void ShardedOptimizerUpdate::reduce(std::span<const Tensor> grads) {
  DTRAIN_CHECK(grads.empty() || grads.size() == vars_.size(),
               "shard_optimizer_state: ", grads.size(), " gradients for ", vars_.size(),
               " variables");
  for (size_t v = 0; v < grads.size(); ++v) {
    DTRAIN_CHECK(
        !grads[v].defined() || (grads[v].dtype() == DType::kFloat32 &&
                                grads[v].num_elements() == vars_[v]->shape().num_elements()),
        "shard_optimizer_state: gradient ", v, " is ", grads[v].to_string(0));
  }
  if (!sharded_) shard_slots();
  // The shard variables view the variables' current storage (a restore may have replaced it).
  const std::vector<RowSlice>& mine = partition_.shards[rank_];
  for (size_t i = 0; i < mine.size(); ++i) {
    const Tensor& v = vars_[mine[i].variable]->tensor();
    const int64_t row = v.num_elements() / std::max<int64_t>(1, rows_of(v.shape()));
    if (shard_vars_[i]->tensor().data<float>() != v.data<float>() + mine[i].row_begin * row) {
      shard_vars_[i]->tensor() = rows_view(v, mine[i]);
    }
  }
  pieces_.clear();
  for (const PieceTemplate& t : templates_) {
    const Tensor* g = grads.empty() ? nullptr : &grads[t.var];
    pieces_.push_back({.src = g != nullptr && g->defined() ? g->data<float>() + t.begin : nullptr,
                       .dst = t.dst,
                       .count = t.count,
                       .owner = t.owner,
                       .keep = t.keep});
  }
  // The float32 extras (the step's flags, moving statistics) ride the gradients' reduction,
  // summed everywhere, as in the plain step's all-reduce: one barrier fewer per step. (Session 6
  // saw this break launch_survivors_test's rejoin, most likely through a survivor that ran a
  // backup's collectives at other steps than its peer, fixed after; the test passes now.)
  // float64 extras go in a second one.
  const auto extra_pieces = [&](DType d) {
    const size_t elem = dtype_size(d);
    for (size_t k = 0; k < extra_.size(); ++k) {
      if (extra_[k].dtype() != d) continue;
      auto* data = static_cast<char*>(extra_[k].raw_data());
      for (const SumRange& r : order_[vars_.size() + k]) {
        pieces_.push_back({.src = data + r.begin * elem,
                           .dst = data + r.begin * elem,
                           .count = static_cast<size_t>(r.end - r.begin),
                           .owner = r.owner});
      }
    }
  };
  extra_pieces(DType::kFloat32);
  collectives_.all_reduce_in_order(pieces_, DType::kFloat32, 0);
  if (stage_ == 1) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const Tensor& full = full_grads_[mine[i].variable];
      const int64_t row =
          full.num_elements() / std::max<int64_t>(1, rows_of(vars_[mine[i].variable]->shape()));
      const float* rows = full.data<float>() + mine[i].row_begin * row;
      if (shard_grads_[i].data<float>() == rows) continue;  // a view of them
      std::memcpy(shard_grads_[i].data<float>(), rows, shard_grads_[i].nbytes());
    }
  }
  pieces_.clear();
  extra_pieces(DType::kFloat64);
  if (!pieces_.empty()) collectives_.all_reduce_in_order(pieces_, DType::kFloat64, 2);
}

bool ShardedOptimizerUpdate::all_finite() {
  double bad = 0;
  for (const Tensor& g : shard_grads_) {
    const float* p = g.data<float>();
    for (int64_t i = 0, n = g.num_elements(); i < n && bad == 0; ++i) {
      if (!std::isfinite(p[i])) bad = 1;
    }
  }
  return collectives_.all_reduce_scalar(bad, ReduceOp::kSum) == 0;
}

// Clipping by norm needs every variable's norm, summed as Optimizer::squared_norm sums it over
// the whole summed gradient: each row in element order, then the rows in order. Each worker holds
// the sums of its own rows only (both stages reduce-scatter), so it sums its rows' squares and the
// row sums are all-gathered (a copy, so every worker adds the same doubles in the same order).
void ShardedOptimizerUpdate::compute_clip_scales() {
  using optim::Optimizer;
  const optim::GradientClipping& clipping = optimizer_.clipping();
  size_t at = 0;
  const std::vector<RowSlice>& shards = partition_.shards[rank_];
  for (size_t i = 0; i < shards.size(); ++i) {
    const int64_t rows = shards[i].row_end - shards[i].row_begin;
    const int64_t row = rows == 0 ? 0 : shard_grads_[i].num_elements() / rows;
    const float* g = shard_grads_[i].data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      local_rows_[at++] = Optimizer::row_sum_of_squares(g + r * row, row);
    }
  }
  collectives_.all_gather_v(local_rows_.data(), all_rows_.data(), row_bytes_);
  std::fill(squared_norms_.begin(), squared_norms_.end(), 0.0);
  for (size_t r = 0; r < all_rows_.size(); ++r) squared_norms_[row_variable_[r]] += all_rows_[r];
  const std::vector<RowSlice>& mine = partition_.shards[rank_];
  if (clipping.clipnorm > 0.0) {
    for (size_t i = 0; i < mine.size(); ++i) {
      clip_scales_[i] =
          Optimizer::clipnorm_scale(squared_norms_[mine[i].variable], clipping.clipnorm);
    }
    return;
  }
  double total = 0.0;
  for (const double s : squared_norms_) total += s;
  std::fill(clip_scales_.begin(), clip_scales_.end(),
            Optimizer::global_clipnorm_scale(total, clipping.global_clipnorm));
}

void ShardedOptimizerUpdate::apply() {
  if (optimizer_.clipping().by_norm()) compute_clip_scales();  // a collective in stage 2
  if (!shard_ptrs_.empty()) {
    optimizer_.prepare_update(shard_grads_, shard_ptrs_, clip_scales_);
    optimizer_.update_part(shard_grads_, shard_ptrs_, 0, 1);
  }
  optimizer_.finish_update();  // every worker counts the step, with or without rows
  // The shards are consecutive rows of the variables taken end to end, and this worker's were
  // updated in place: the other ranks' rows land straight in the variables around them.
  for (size_t v = 0; v < vars_.size(); ++v) {
    Tensor& t = vars_[v]->tensor();
    var_bytes_[v] = {static_cast<std::byte*>(t.raw_data()), t.nbytes()};
  }
  collectives_.all_gather_v(nullptr, var_bytes_, shard_bytes_);
}

void ShardedOptimizerUpdate::gather_slots() {
  if (!sharded_) return;
  const std::vector<std::string> names = optimizer_.slot_names();
  optimizer_.build(vars_);
  for (const std::string& name : names) {
    size_t offset = 0;
    for (Variable* s : shard_ptrs_) {
      const Tensor& t = optimizer_.slot(*s, name)->tensor();
      std::memcpy(local_.data() + offset, t.data<float>(), t.nbytes());
      offset += static_cast<size_t>(t.num_elements());
    }
    collectives_.all_gather_v(local_.data(), flat_.data(), shard_bytes_);
    offset = 0;
    for (Variable* v : vars_) {
      Tensor& t = optimizer_.slot(*v, name)->tensor();
      std::memcpy(t.data<float>(), flat_.data() + offset, t.nbytes());
      offset += static_cast<size_t>(t.num_elements());
    }
  }
  optimizer_.drop_slots(shard_ptrs_);
  sharded_ = false;
}

size_t ShardedOptimizerUpdate::slot_bytes() const {
  size_t bytes = 0;
  const std::vector<std::string> names = optimizer_.slot_names();
  for (Variable* v : sharded_ ? shard_ptrs_ : vars_) {
    for (const std::string& name : names) {
      if (const Variable* s = optimizer_.slot(*v, name)) bytes += s->tensor().nbytes();
    }
  }
  return bytes;
}

size_t ShardedOptimizerUpdate::gradient_bytes() const {
  size_t bytes = 0;  // stage 1 keeps a whole-size buffer (only its rows' sums are written)
  for (const Tensor& g : stage_ == 1 ? full_grads_ : shard_grads_) bytes += g.nbytes();
  return bytes;
}

}  // namespace dtrain::distribute
