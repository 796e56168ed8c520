// The exact reduction over logical replicas (logical_replicas.h): pack, all-gather, ordered sum.
#include "logical_replicas.h"

#include <algorithm>
#include <cstring>

#include "dtrain/core/error.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::distribute {
namespace {

size_t align8(size_t n) { return (n + 7) / 8 * 8; }

template <class T>
void ordered_sum(std::span<const void* const> sources, size_t stride, size_t v, Tensor& out,
                 int64_t b, int64_t e, double scale) {
  T* o = static_cast<T*>(out.raw_data());
  bool first = true;
  for (size_t at = v; at < sources.size(); at += stride) {
    const T* p = static_cast<const T*>(sources[at]);
    if (p == nullptr) continue;
    if (first) {
      if (p != o) std::copy(p + b, p + e, o + b);
      first = false;
    } else {
      for (int64_t i = b; i < e; ++i) o[i] += p[i];
    }
  }
  if (first) std::fill(o + b, o + e, T(0));
  if (scale != 1.0) {
    const T f = static_cast<T>(scale);
    for (int64_t i = b; i < e; ++i) o[i] *= f;
  }
}

}  // namespace

std::pair<int, int> logical_block(int num_logical, int workers, int rank) {
  if (num_logical < 1) {
    throw InvalidArgumentError(
        str_cat("logical replicas: ", num_logical, " logical replicas, must be >= 1"));
  }
  if (workers > num_logical) {
    throw InvalidArgumentError(str_cat("logical replicas: ", workers, " workers for ", num_logical,
                                       " logical replicas; every worker needs at least one (run "
                                       "at most ",
                                       num_logical, " workers or raise the count)"));
  }
  DTRAIN_CHECK(rank >= 0 && rank < workers, "logical_block: rank ", rank, " of ", workers);
  const int base = num_logical / workers, extra = num_logical % workers;
  const int begin = rank * base + std::min(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

void LogicalReplicaReduction::gather(Collectives* collectives,
                                     std::span<const std::vector<Tensor>> local,
                                     std::span<const Tensor> out) {
  const size_t nv = out.size();
  const int workers = collectives != nullptr ? collectives->size() : 1;
  const int rank = collectives != nullptr ? collectives->rank() : 0;
  const auto [first, last] = logical_block(num_logical_, workers, rank);
  DTRAIN_CHECK(static_cast<int>(local.size()) == last - first, "logical replicas: got ",
               local.size(), " gradient lists, this worker holds logical replicas ", first, "..",
               last - 1);
  for (size_t i = 0; i < local.size(); ++i) {
    if (local[i].empty()) continue;
    DTRAIN_CHECK(local[i].size() == nv, "logical replicas: logical replica ", first + i, " has ",
                 local[i].size(), " gradients, expected ", nv);
    for (size_t v = 0; v < nv; ++v) {
      const Tensor& g = local[i][v];
      DTRAIN_CHECK(!g.defined() || (g.shape() == out[v].shape() && g.dtype() == out[v].dtype()),
                   "logical replicas: logical replica ", first + i, " gradient ", v, " is ",
                   g.to_string(0), ", expected ", out[v].to_string(0));
    }
  }
  sources_.assign(static_cast<size_t>(num_logical_) * nv, nullptr);
  if (workers == 1) {
    for (size_t i = 0; i < local.size(); ++i) {
      if (local[i].empty()) continue;
      for (size_t v = 0; v < nv; ++v) {
        if (local[i][v].defined()) sources_[i * nv + v] = local[i][v].raw_data();
      }
    }
    return;
  }
  // A record: one presence byte per variable, then each variable's bytes (8-byte aligned).
  offsets_.resize(nv);
  size_t at = align8(nv);
  for (size_t v = 0; v < nv; ++v) {
    offsets_[v] = at;
    at += align8(out[v].nbytes());
  }
  record_bytes_ = at;
  send_.resize(local.size() * record_bytes_);
  for (size_t i = 0; i < local.size(); ++i) {
    std::byte* rec = send_.data() + i * record_bytes_;
    for (size_t v = 0; v < nv; ++v) {
      const bool present = !local[i].empty() && local[i][v].defined();
      rec[v] = std::byte{present ? uint8_t{1} : uint8_t{0}};
      if (present) std::memcpy(rec + offsets_[v], local[i][v].raw_data(), out[v].nbytes());
    }
  }
  bytes_per_rank_.resize(static_cast<size_t>(workers));
  for (int w = 0; w < workers; ++w) {
    const auto [b, e] = logical_block(num_logical_, workers, w);
    bytes_per_rank_[w] = static_cast<size_t>(e - b) * record_bytes_;
  }
  recv_.resize(static_cast<size_t>(num_logical_) * record_bytes_ / sizeof(double));
  collectives->all_gather_v(send_.data(), recv_.data(), bytes_per_rank_);
  const auto* all = reinterpret_cast<const std::byte*>(recv_.data());
  for (int l = 0; l < num_logical_; ++l) {
    const std::byte* rec = all + static_cast<size_t>(l) * record_bytes_;
    for (size_t v = 0; v < nv; ++v) {
      if (rec[v] != std::byte{0}) sources_[l * nv + v] = rec + offsets_[v];
    }
  }
}

void LogicalReplicaReduction::sum(std::span<Tensor> out, int part, int parts, double scale) const {
  for (size_t v = 0; v < out.size(); ++v) {
    const auto [b, e] = optim::Optimizer::element_range(out[v].num_elements(), part, parts);
    if (b >= e) continue;
    if (out[v].dtype() == DType::kFloat32) {
      ordered_sum<float>(sources_, out.size(), v, out[v], b, e, scale);
    } else {
      ordered_sum<double>(sources_, out.size(), v, out[v], b, e, scale);
    }
  }
}

}  // namespace dtrain::distribute
