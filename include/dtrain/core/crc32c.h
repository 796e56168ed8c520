// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TensorFlow's tensor
// bundles, LevelDB tables and TFRecord files, with the "masked" form they store on disk. Uses the
// SSE4.2 crc32 instruction (three interleaved streams) when compiled with __SSE4_2__, carry-less
// multiplication folds for buffers of 256 bytes and more where the target has VPCLMULQDQ and
// AVX2, a slicing-by-8 table otherwise. Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace dtrain::crc32c {

// The CRC-32C of `data` appended to a byte sequence whose CRC-32C is `crc` (0 for an empty
// sequence): extend(extend(0, a), b) == value(a ++ b).
uint32_t extend(uint32_t crc, const void* data, size_t n);

// Copies `n` bytes from `src` to `dst` (which must not overlap) and returns
// extend(crc, src, n), in one pass: the CRC is taken of the words as they are loaded for the
// copy. `dst` is written past the cache (non-temporal stores, then a store fence) where the CPU
// has them: for a copy that nothing reads again soon, such as a snapshot of the training state.
uint32_t extend_copy(uint32_t crc, void* dst, const void* src, size_t n);

// The CRC-32C of `data`; value("123456789") == 0xE3069283.
inline uint32_t value(const void* data, size_t n) { return extend(0, data, n); }
inline uint32_t value(std::string_view s) { return extend(0, s.data(), s.size()); }

// The masked form LevelDB and TensorFlow store: a CRC of data that itself embeds CRCs is
// otherwise prone to degenerate values (leveldb/util/crc32c.h).
inline constexpr uint32_t kMaskDelta = 0xa282ead8u;
inline constexpr uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }
// Inverse of mask().
inline constexpr uint32_t unmask(uint32_t masked) {
  const uint32_t rot = masked - kMaskDelta;
  return (rot >> 17) | (rot << 15);
}

// True when extend() uses the hardware instruction.
bool hardware_accelerated();

namespace detail {
// The portable table implementation, whatever extend() uses (for tests).
uint32_t extend_software(uint32_t crc, const void* data, size_t n);
// The three crc32-instruction chains alone, never the folds; extend_software where the target
// lacks SSE4.2 (for tests, so that every path is checked on a CPU that folds).
uint32_t extend_chains(uint32_t crc, const void* data, size_t n);
}  // namespace detail

}  // namespace dtrain::crc32c
