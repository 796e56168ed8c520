// CRC-32C. The hardware path runs three independent crc32 chains over adjacent blocks (the
// instruction has a latency of 3 cycles and a throughput of 1, so one chain uses a third of the
// unit) and joins them with a table that shifts a CRC over one block of zeros.
#include "dtrain/core/crc32c.h"

#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

namespace dtrain::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// Slicing-by-8 tables: kTables[k][b] is the CRC register after byte b followed by k zero bytes.
struct Tables {
  uint32_t t[8][256];
  constexpr Tables() : t() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
      t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};
constexpr Tables kTables;

inline uint64_t load_le64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;  // little-endian hosts only (as is the rest of dtrain's I/O)
}

// The raw register update (no pre/post inversion) in software.
uint32_t raw_software(uint32_t c, const uint8_t* p, size_t n) {
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = (c >> 8) ^ kTables.t[0][(c ^ *p++) & 0xFF];
    --n;
  }
  while (n >= 8) {
    const uint64_t v = load_le64(p) ^ c;
    c = kTables.t[7][v & 0xFF] ^ kTables.t[6][(v >> 8) & 0xFF] ^ kTables.t[5][(v >> 16) & 0xFF] ^
        kTables.t[4][(v >> 24) & 0xFF] ^ kTables.t[3][(v >> 32) & 0xFF] ^
        kTables.t[2][(v >> 40) & 0xFF] ^ kTables.t[1][(v >> 48) & 0xFF] ^ kTables.t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0) c = (c >> 8) ^ kTables.t[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__SSE4_2__)
constexpr size_t kBlock = 8192;  // bytes per chain per round; rounds cover 3 * kBlock bytes

uint32_t raw_hardware_serial(uint32_t c, const uint8_t* p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    c64 = _mm_crc32_u64(c64, load_le64(p));
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n-- > 0) c = _mm_crc32_u8(c, *p++);
  return c;
}

// shift[k][b]: the register after (b << 8k) is run over kBlock zero bytes. Shifting is linear
// over GF(2), so shifting any register is the XOR of four lookups.
struct ShiftTable {
  std::array<std::array<uint32_t, 256>, 4> t;
  ShiftTable() {
    static const uint8_t zeros[kBlock] = {};
    for (int k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) t[k][b] = raw_hardware_serial(b << (8 * k), zeros, kBlock);
    }
  }
  uint32_t shift(uint32_t c) const {
    return t[0][c & 0xFF] ^ t[1][(c >> 8) & 0xFF] ^ t[2][(c >> 16) & 0xFF] ^ t[3][c >> 24];
  }
};

uint32_t raw_hardware(uint32_t c, const uint8_t* p, size_t n) {
  if (n >= 3 * kBlock) {
    static const ShiftTable table;  // built once, thread-safe (magic static)
    do {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      const uint8_t* p1 = p + kBlock;
      const uint8_t* p2 = p + 2 * kBlock;
      for (size_t i = 0; i < kBlock; i += 8) {
        c0 = _mm_crc32_u64(c0, load_le64(p + i));
        c1 = _mm_crc32_u64(c1, load_le64(p1 + i));
        c2 = _mm_crc32_u64(c2, load_le64(p2 + i));
      }
      // raw(s, A|B|C) = shift(shift(raw(s, A)) ^ raw(0, B)) ^ raw(0, C).
      c = table.shift(table.shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
      p += 3 * kBlock;
      n -= 3 * kBlock;
    } while (n >= 3 * kBlock);
  }
  return raw_hardware_serial(c, p, n);
}
#endif

}  // namespace

uint32_t extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(__SSE4_2__)
  return ~raw_hardware(~crc, p, n);
#else
  return ~raw_software(~crc, p, n);
#endif
}

bool hardware_accelerated() {
#if defined(__SSE4_2__)
  return true;
#else
  return false;
#endif
}

namespace detail {
// The portable path, exposed for tests that compare both implementations.
uint32_t extend_software(uint32_t crc, const void* data, size_t n) {
  return ~raw_software(~crc, static_cast<const uint8_t*>(data), n);
}
}  // namespace detail

}  // namespace dtrain::crc32c
