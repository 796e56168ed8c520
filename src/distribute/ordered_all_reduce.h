// Private to distribute: the ring behind Collectives::all_reduce_in_order and the chunk size of
// Gloo's ring all-reduce that Collectives::summation_order replays.
#pragma once

#include <gloo/context.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

#include "dtrain/distribute/collectives.h"

namespace dtrain::distribute {

// all_reduce_in_order's persistent state: the pieces packed by owner (owner 0's first; in each
// owner's region the pieces every worker gets, then those one worker keeps), a receive buffer
// for one owner's run, and each owner's counts and offset.
struct OrderedBuffer {
  std::vector<double> storage;  // 8-byte aligned
  std::vector<double> scratch;
  std::vector<size_t> counts, shared, offsets, cursor, kept_cursor;
  std::vector<size_t> at;  // each piece's element offset in storage
};

// Elements per chunk of Gloo's new-style ring all-reduce (gloo/allreduce.cc, ring()) over a
// buffer of `bytes` bytes of `elem`-byte elements and `n` ranks.
size_t ring_chunk_elements(size_t bytes, size_t elem, size_t n);

// Sums `pieces` of `dtype` across the ranks of `context` in their owners' ring order, in place
// (see Collectives::all_reduce_in_order). Throws Gloo's exceptions (the caller maps them).
void ordered_ring_all_reduce(gloo::Context& context, std::span<const OrderedPiece> pieces,
                             DType dtype, OrderedBuffer& b, std::chrono::milliseconds timeout);

}  // namespace dtrain::distribute
