// Philox-4x32-10.
#include "dtrain/core/random.h"

#include <cmath>

namespace dtrain {
namespace {
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;
}  // namespace

void Philox::block(uint64_t seed, uint64_t block, uint32_t out[4]) {
  uint32_t c0 = static_cast<uint32_t>(block), c1 = static_cast<uint32_t>(block >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{kPhiloxM0} * c0;
    const uint64_t p1 = uint64_t{kPhiloxM1} * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n1 = static_cast<uint32_t>(p1);
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    const uint32_t n3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c1 = n1;
    c2 = n2;
    c3 = n3;
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  out[0] = c0;
  out[1] = c1;
  out[2] = c2;
  out[3] = c3;
}

uint32_t Philox::next_u32() {
  const uint64_t b = state_.counter / 4;
  if (b != cached_block_) {
    block(state_.seed, b, cache_);
    cached_block_ = b;
  }
  return cache_[state_.counter++ % 4];
}

uint64_t Philox::next_u64() {
  const uint64_t hi = next_u32();
  return (hi << 32) | next_u32();
}

float Philox::uniform() { return static_cast<float>(next_u32() >> 8) * (1.0f / 16777216.0f); }

float Philox::normal() {
  // Box-Muller; u1 in (0, 1] so the log is finite.
  const double u1 = (static_cast<double>(next_u32()) + 1.0) / 4294967296.0;
  const double u2 = static_cast<double>(next_u32()) / 4294967296.0;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

uint64_t Philox::uniform_int(uint64_t n) {
  if (n <= 1) return 0;
  if (n <= 0xFFFFFFFFull) {
    const uint32_t n32 = static_cast<uint32_t>(n);
    const uint32_t limit = static_cast<uint32_t>(0x100000000ull - (0x100000000ull % n32));
    for (;;) {
      const uint32_t x = next_u32();
      if (limit == 0 || x < limit) return x % n32;
    }
  }
  const uint64_t limit = ~uint64_t{0} - (~uint64_t{0} % n);
  for (;;) {
    const uint64_t x = next_u64();
    if (x < limit) return x % n;
  }
}

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace dtrain

#include <atomic>
#include <mutex>
#include <random>

namespace dtrain {
namespace {
std::mutex g_seed_mu;
bool g_has_seed = false;      // guarded by g_seed_mu
uint64_t g_seed = 0;          // guarded by g_seed_mu
uint64_t g_seed_counter = 0;  // guarded by g_seed_mu
}  // namespace

namespace {
thread_local ReplicaStream t_replica_stream;
}  // namespace

ReplicaStream current_replica_stream() { return t_replica_stream; }
void set_current_replica_stream(ReplicaStream stream) { t_replica_stream = stream; }

void set_random_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(g_seed_mu);
  g_has_seed = true;
  g_seed = seed;
  g_seed_counter = 0;
}

uint64_t next_seed() {
  std::lock_guard<std::mutex> lock(g_seed_mu);
  if (g_has_seed) return mix_seed(g_seed, g_seed_counter++);
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

}  // namespace dtrain
