// Collectives' reductions in a fixed order of additions: summation_order (which worker sums
// which range, replaying all_reduce's packing and Gloo's ring chunks), all_reduce_in_order, and
// its ring over Gloo: pieces packed by owner, a reduce-scatter along the ring in Gloo's order of
// additions, then an all-gather.
#include "ordered_all_reduce.h"

#include <gloo/allreduce.h>
#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>
#include <gloo/types.h>

#include <algorithm>
#include <cstring>

#include "collectives_impl.h"
#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

size_t round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

template <class T>
void add_into(void* dst, const void* src, size_t count) {
  T* d = static_cast<T*>(dst);
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < count; ++i) d[i] = d[i] + s[i];
}

// Slot prefixes of all_reduce_in_order's two phases (Gloo's own use 0x01..0x08).
constexpr uint8_t kOrderedReduceScatterSlot = 0x41;
constexpr uint8_t kOrderedAllgatherSlot = 0x42;
constexpr uint8_t kOrderedKeepSlot = 0x43;

}  // namespace

// The buffer is cut into numSegments = roundUp(max(ceil(bytes / maxSegment), 2n), n) segments
// of roundUp(ceil(bytes / numSegments), elem) bytes, numSegments / n to a chunk; chunk c is
// summed along the ring (rank r receives from r + 1) starting on rank c - 1, ending on rank c.
size_t ring_chunk_elements(size_t bytes, size_t elem, size_t n) {
  const size_t max_segment =
      elem * std::max<size_t>(1, gloo::detail::AllreduceOptionsImpl::kMaxSegmentSize / elem);
  const size_t segments = round_up(std::max((bytes + max_segment - 1) / max_segment, 2 * n), n);
  const size_t segment_bytes = round_up((bytes + segments - 1) / segments, elem);
  return segment_bytes * (segments / n) / elem;
}

void ordered_ring_all_reduce(gloo::Context& context, std::span<const OrderedPiece> pieces,
                             DType dtype, OrderedBuffer& b, std::chrono::milliseconds timeout) {
  const int n = context.size;
  const size_t elem = dtype_size(dtype);
  // Region c (owner c's pieces): those every worker gets first, then those one worker keeps.
  b.counts.assign(n, 0);
  b.shared.assign(n, 0);
  for (const OrderedPiece& p : pieces) {
    b.counts[p.owner] += p.count;
    if (p.keep < 0) b.shared[p.owner] += p.count;
  }
  b.offsets.assign(n, 0);
  size_t total = 0, largest = 0;
  for (int c = 0; c < n; ++c) {
    b.offsets[c] = total;
    total += b.counts[c];
    largest = std::max(largest, b.counts[c]);
  }
  if (total == 0) return;
  if (b.storage.size() * 8 < total * elem) b.storage.resize((total * elem + 7) / 8);
  if (b.scratch.size() * 8 < largest * elem) b.scratch.resize((largest * elem + 7) / 8);
  auto* base = reinterpret_cast<char*>(b.storage.data());
  // Where each piece sits: shared pieces from the region's start, kept ones after them.
  b.at.resize(pieces.size());
  b.cursor = b.offsets;
  b.kept_cursor.resize(n);
  for (int c = 0; c < n; ++c) b.kept_cursor[c] = b.offsets[c] + b.shared[c];
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OrderedPiece& p = pieces[i];
    size_t& cur = p.keep < 0 ? b.cursor[p.owner] : b.kept_cursor[p.owner];
    b.at[i] = cur;
    cur += p.count;
    char* at = base + b.at[i] * elem;
    if (p.src == nullptr) {
      std::memset(at, 0, p.count * elem);
    } else {
      std::memcpy(at, p.src, p.count * elem);
    }
  }
  const int r = context.rank;
  const int left = (r + n - 1) % n, right = (r + 1) % n;
  auto data = context.createUnboundBuffer(base, total * elem);
  auto scratch = context.createUnboundBuffer(b.scratch.data(), largest * elem);
  const auto wait = [&](bool ok, const char* what) {
    if (!ok) throw gloo::IoException(str_cat("all_reduce_in_order: ", what, " was aborted"));
  };
  // Reduce-scatter as Gloo's ring: at step t rank r passes the partial sum of owner r + 1 + t
  // to r - 1 and adds its own values to owner r + 2 + t's partial sum from r + 1; after n - 1
  // steps it holds owner r's total.
  const auto rs_slot = gloo::Slot::build(kOrderedReduceScatterSlot, 0);
  for (int t = 0; t + 1 < n; ++t) {
    const int send = (r + 1 + t) % n, recv = (r + 2 + t) % n;
    if (b.counts[recv] > 0) scratch->recv(right, rs_slot, 0, b.counts[recv] * elem);
    if (b.counts[send] > 0) {
      data->send(left, rs_slot, b.offsets[send] * elem, b.counts[send] * elem);
    }
    if (b.counts[recv] > 0) {
      wait(scratch->waitRecv(timeout), "a receive");
      char* own = base + b.offsets[recv] * elem;
      if (dtype == DType::kFloat32) {
        add_into<float>(own, b.scratch.data(), b.counts[recv]);
      } else {
        add_into<double>(own, b.scratch.data(), b.counts[recv]);
      }
    }
    if (b.counts[send] > 0) wait(data->waitSend(timeout), "a send");
  }
  // All-gather of the shared pieces: owner r's totals travel to r + 1, r + 2, ...
  const auto ag_slot = gloo::Slot::build(kOrderedAllgatherSlot, 0);
  for (int t = 0; t + 1 < n; ++t) {
    const int send = (r + n - t) % n, recv = (r + 2 * n - t - 1) % n;
    if (b.shared[recv] > 0) {
      data->recv(left, ag_slot, b.offsets[recv] * elem, b.shared[recv] * elem);
    }
    if (b.shared[send] > 0) {
      data->send(right, ag_slot, b.offsets[send] * elem, b.shared[send] * elem);
    }
    if (b.shared[recv] > 0) wait(data->waitRecv(timeout), "a receive");
    if (b.shared[send] > 0) wait(data->waitSend(timeout), "a send");
  }
  // The kept pieces go from their owner to their keeper, in piece order on every pair.
  const auto keep_slot = gloo::Slot::build(kOrderedKeepSlot, 0);
  int sends = 0, recvs = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OrderedPiece& p = pieces[i];
    if (p.keep < 0 || p.keep == p.owner || p.count == 0) continue;
    if (p.owner == r) {
      data->send(p.keep, keep_slot, b.at[i] * elem, p.count * elem);
      ++sends;
    } else if (p.keep == r) {
      data->recv(p.owner, keep_slot, b.at[i] * elem, p.count * elem);
      ++recvs;
    }
  }
  for (int i = 0; i < recvs; ++i) wait(data->waitRecv(timeout), "a receive");
  for (int i = 0; i < sends; ++i) wait(data->waitSend(timeout), "a send");
  for (size_t i = 0; i < pieces.size(); ++i) {
    const OrderedPiece& p = pieces[i];
    if (p.keep >= 0 && p.keep != r) continue;
    std::memcpy(p.dst, base + b.at[i] * elem, p.count * elem);
  }
}

std::vector<std::vector<SumRange>> Collectives::summation_order(
    std::span<const Tensor> tensors) const {
  const Impl& m = *impl_;
  const int n = size();
  const AllreduceAlgorithm a = m.options.algorithm;
  if (n >= 3 && a != AllreduceAlgorithm::kAuto && a != AllreduceAlgorithm::kReduceScatter) {
    throw FailedPreconditionError(
        str_cat("Collectives::summation_order: the all-reduce algorithm chosen for ", n,
                " workers sums in an order of its own; overlapped or sharded reductions need "
                "AllreduceAlgorithm::kAuto or kReduceScatter"));
  }
  std::vector<std::vector<SumRange>> out(tensors.size());
  // Tensors [first, last) reduced as one buffer: with two workers every order gives the same
  // bits (a + b == b + a) and the chunks below serve as owners all the same.
  auto assign = [&](size_t first, size_t last) {
    size_t bytes = 0;
    for (size_t k = first; k < last; ++k) bytes += tensors[k].nbytes();
    const size_t elem = dtype_size(tensors[first].dtype());
    const auto chunk = static_cast<int64_t>(n == 1 ? std::max<size_t>(1, bytes / elem)
                                                   : ring_chunk_elements(bytes, elem, n));
    int64_t offset = 0;
    for (size_t k = first; k < last; ++k) {
      const int64_t count = tensors[k].num_elements();
      for (int64_t b = 0; b < count;) {
        const int owner = static_cast<int>(std::min<int64_t>((offset + b) / chunk, n - 1));
        const int64_t e = owner == n - 1 ? count : std::min(count, (owner + 1) * chunk - offset);
        out[k].push_back({b, e, owner});
        b = e;
      }
      offset += count;
    }
  };
  // The packing of all_reduce, step by step.
  size_t i = 0;
  while (i < tensors.size()) {
    bool in_place = false;
    size_t bytes = 0;
    const size_t j = m.bucket_end(tensors, i, &in_place, &bytes);
    assign(i, j);
    i = j;
  }
  return out;
}

void Collectives::all_reduce_in_order(std::span<const OrderedPiece> pieces, DType dtype,
                                      size_t buffer) {
  DTRAIN_CHECK(dtype == DType::kFloat32 || dtype == DType::kFloat64, "all_reduce_in_order: dtype ",
               dtype_name(dtype), " is not supported (float32, float64)");
  const int n = size();
  const size_t elem = dtype_size(dtype);
  for (const OrderedPiece& p : pieces) {
    DTRAIN_CHECK(p.owner >= 0 && p.owner < n && p.keep >= -1 && p.keep < n &&
                     (p.dst != nullptr || (p.keep >= 0 && p.keep != rank())),
                 "all_reduce_in_order: owner ", p.owner, " or keep ", p.keep,
                 " is out of range for ", n,
                 " workers, or a piece this worker keeps has no output");
  }
  if (n == 1) {
    for (const OrderedPiece& p : pieces) {
      if (p.src == nullptr) {
        std::memset(p.dst, 0, p.count * elem);
      } else if (p.src != p.dst) {
        std::memcpy(p.dst, p.src, p.count * elem);
      }
    }
    return;
  }
  Impl& m = *impl_;
  m.guarded("all_reduce_in_order", [&] {
    if (m.shm) return m.shm->all_reduce_in_order(pieces, dtype);
    if (m.ordered.size() <= buffer) m.ordered.resize(buffer + 1);
    ordered_ring_all_reduce(*m.context, pieces, dtype, m.ordered[buffer], m.options.timeout);
  });
}

}  // namespace dtrain::distribute
