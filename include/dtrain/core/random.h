// Counter-based random numbers (Philox-4x32-10, Salmon et al. 2011, as in TF and JAX).
// The whole state is two integers (seed, counter), so any stream can be checkpointed and
// resumed exactly. A Philox object is thread-compatible; use one per thread.
#pragma once

#include <cstdint>

namespace dtrain {

struct RngState {
  uint64_t seed = 0;
  uint64_t counter = 0;  // number of 32-bit values drawn so far
  bool operator==(const RngState&) const = default;
};

class Philox {
 public:
  explicit Philox(uint64_t seed = 0, uint64_t counter = 0) : state_{seed, counter} {}
  explicit Philox(RngState state) : state_(state) {}

  // The next 32 random bits.
  uint32_t next_u32();
  uint64_t next_u64();
  // Uniform in [0, 1), 24 bits of randomness.
  float uniform();
  // Uniform in [lo, hi).
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Standard normal (Box-Muller on two uniforms).
  float normal();
  // Uniform integer in [0, n), unbiased (rejection sampling); n > 0.
  uint64_t uniform_int(uint64_t n);

  RngState state() const { return state_; }
  void set_state(RngState s) {
    state_ = s;
    cached_block_ = ~uint64_t{0};
  }

  // The block of four values at `block` for `seed`: the Philox bijection itself.
  static void block(uint64_t seed, uint64_t block, uint32_t out[4]);

 private:
  RngState state_;
  // The last computed block (a block yields four values): a cache, not state.
  uint64_t cached_block_ = ~uint64_t{0};
  uint32_t cache_[4] = {};
};

// Derives an independent seed for a named sub-stream (e.g. per layer, per epoch), with a
// SplitMix64-style mix, so that components seeded from one global seed do not share streams.
uint64_t mix_seed(uint64_t seed, uint64_t stream);

}  // namespace dtrain

namespace dtrain {

// The global seed, like tf.random.set_seed / keras.utils.set_random_seed: components created
// without an explicit seed (initializers, Dropout, shuffle) derive theirs from it and a counter,
// so a program that sets it is deterministic. Thread-safe.
void set_random_seed(uint64_t seed);
// Returns a fresh seed for a component that was given none: derived from the global seed and a
// per-process counter when a global seed is set, else from std::random_device.
uint64_t next_seed();

// Which replica the calling thread computes for, when a distribution strategy with several
// replicas in sync runs it (strategies set it on their replica threads around each step):
// `replica` is the global replica id (across workers), `local` its index in this process; both
// -1 elsewhere. Components that draw random numbers per call (Dropout) give each replica its own
// stream, so what a replica draws does not depend on how replica threads interleave, and
// replicas on different workers do not draw the same numbers.
struct ReplicaStream {
  int replica = -1;
  int local = -1;
};
ReplicaStream current_replica_stream();
void set_current_replica_stream(ReplicaStream stream);

}  // namespace dtrain
