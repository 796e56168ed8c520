// CRC-32C. The hardware path runs three independent crc32 chains over adjacent blocks (the
// instruction has a latency of 3 cycles and a throughput of 1, so one chain uses a third of the
// unit) and joins them with a table that shifts a CRC over one block of zeros. extend_copy runs
// the same chains and stores every word it loaded to the destination with non-temporal stores:
// the copy rides on the loads the CRC makes anyway. Where the CPU has carry-less multiplication
// on 256-bit registers (VPCLMULQDQ with AVX2: AMD Zen 3 and later, Intel Ice Lake and later),
// buffers of 256 bytes and more are folded instead: eight 128-bit accumulators, each multiplied
// forward by x^1024 mod P per 128 bytes, then folded into one and finished with the crc32
// instruction; about 16 bytes per cycle against the chains' 8, so the copy runs at memcpy's pace.
#include "dtrain/core/crc32c.h"

#include <algorithm>
#include <array>
#include <cstring>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif
#if defined(__SSE4_2__) && defined(__x86_64__)
#include <emmintrin.h>  // _mm_stream_si64
#define DTRAIN_CRC32C_STREAMING_COPY 1
#endif
#if defined(__AVX__)
#include <immintrin.h>  // _mm256_stream_si256
#endif
#if defined(__SSE4_2__) && defined(__x86_64__) && defined(__AVX2__) && defined(__PCLMUL__) && \
    defined(__VPCLMULQDQ__)
#define DTRAIN_CRC32C_FOLD 1
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

const ShiftTable& shift_table() {
  static const ShiftTable table;  // built once, thread-safe (magic static)
  return table;
}

uint32_t raw_hardware(uint32_t c, const uint8_t* p, size_t n) {
  if (n >= 3 * kBlock) {
    const ShiftTable& table = shift_table();
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

#if defined(DTRAIN_CRC32C_FOLD)
// Folding (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", Intel,
// 2009), derived here for the reflected bit order. A 16-byte block is a polynomial whose first
// bit is its x^127 term; a block X that stands D bits before a later position contributes
// X * x^D there, and X * x^D == hi(X) * (x^(D+63) mod P) + lo(X) * (x^(D-1) mod P) (mod P), each
// product a 64x64 carry-less multiplication whose result lands in the later block's frame (the
// constants carry the one-bit offset of a reflected product). The buffer's first 32 bits take the
// incoming register (a reflected CRC's register is XORed into the next data word); the one
// folded block left at the end is then run through the crc32 instruction from a zero register.
constexpr size_t kFoldMin = 256;  // below it, the chains are as fast

// x^n mod P in the normal bit order (bit t <-> x^t), P = x^32 + 0x1EDC6F41.
constexpr uint32_t x_pow_mod(unsigned n) {
  uint64_t r = 1;
  for (unsigned i = 0; i < n; ++i) {
    r <<= 1;
    if ((r >> 32) != 0) r ^= (uint64_t{1} << 32) | 0x1EDC6F41u;
  }
  return static_cast<uint32_t>(r);
}
// r as a carry-less multiplication operand whose bit j is the x^(63-j) term.
constexpr uint64_t reflected_operand(uint32_t r) {
  uint64_t c = 0;
  for (int t = 0; t < 32; ++t) {
    if (((r >> t) & 1u) != 0) c |= uint64_t{1} << (63 - t);
  }
  return c;
}
// The operands of a fold over `d` bits: for the block's low qword (its x^127..x^64 terms), then
// for its high qword.
constexpr uint64_t fold_hi(unsigned d) { return reflected_operand(x_pow_mod(d + 63)); }
constexpr uint64_t fold_lo(unsigned d) { return reflected_operand(x_pow_mod(d - 1)); }
constexpr uint64_t kFold1024Hi = fold_hi(1024), kFold1024Lo = fold_lo(1024);
constexpr uint64_t kFold128Hi = fold_hi(128), kFold128Lo = fold_lo(128);

inline __m128i fold128(__m128i x, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}
inline __m256i fold256(__m256i x, __m256i k) {
  return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                          _mm256_clmulepi64_epi128(x, k, 0x11));
}

// The raw register after `p` [n >= 128]; with kCopy, every 32 loaded bytes are also stored to
// `d` past the cache (d + 32k must be 32-byte aligned) and the tail's to `d` plainly.
template <bool kCopy>
uint32_t raw_fold(uint32_t c, uint8_t* d, const uint8_t* p, size_t n) {
  const __m256i k1024 =
      _mm256_set_epi64x(static_cast<long long>(kFold1024Lo), static_cast<long long>(kFold1024Hi),
                        static_cast<long long>(kFold1024Lo), static_cast<long long>(kFold1024Hi));
  const __m128i k128 =
      _mm_set_epi64x(static_cast<long long>(kFold128Lo), static_cast<long long>(kFold128Hi));
  const auto load = [&](size_t at) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + at));
    if constexpr (kCopy) _mm256_stream_si256(reinterpret_cast<__m256i*>(d + at), v);
    return v;
  };
  __m256i a0 = _mm256_xor_si256(load(0), _mm256_set_epi64x(0, 0, 0, c));
  __m256i a1 = load(32), a2 = load(64), a3 = load(96);
  size_t i = 128;
  for (; i + 128 <= n; i += 128) {
    a0 = _mm256_xor_si256(fold256(a0, k1024), load(i));
    a1 = _mm256_xor_si256(fold256(a1, k1024), load(i + 32));
    a2 = _mm256_xor_si256(fold256(a2, k1024), load(i + 64));
    a3 = _mm256_xor_si256(fold256(a3, k1024), load(i + 96));
  }
  // The eight blocks in buffer order, folded into one.
  const __m128i blocks[8] = {_mm256_castsi256_si128(a0), _mm256_extracti128_si256(a0, 1),
                             _mm256_castsi256_si128(a1), _mm256_extracti128_si256(a1, 1),
                             _mm256_castsi256_si128(a2), _mm256_extracti128_si256(a2, 1),
                             _mm256_castsi256_si128(a3), _mm256_extracti128_si256(a3, 1)};
  __m128i x = blocks[0];
  for (int b = 1; b < 8; ++b) x = _mm_xor_si128(fold128(x, k128), blocks[b]);
  for (; i + 16 <= n; i += 16) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), v);
    x = _mm_xor_si128(fold128(x, k128), v);
  }
  uint64_t r = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(x)));
  r = _mm_crc32_u64(r, static_cast<uint64_t>(_mm_extract_epi64(x, 1)));
  c = static_cast<uint32_t>(r);
  for (; i < n; ++i) {
    c = _mm_crc32_u8(c, p[i]);
    if constexpr (kCopy) d[i] = p[i];
  }
  return c;
}
#endif

#if defined(DTRAIN_CRC32C_STREAMING_COPY)
// Stores the 8 bytes `v` at `d` (8-byte aligned) past the cache.
inline void stream64(uint8_t* d, uint64_t v) {
  _mm_stream_si64(reinterpret_cast<long long*>(d), static_cast<long long>(v));
}

#if defined(__AVX__)
// Copies the 32 bytes at `p` to `d` (32-byte aligned) past the cache.
inline void stream256(uint8_t* d, const uint8_t* p) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(d),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

// raw_hardware_serial, storing each loaded word at `d` (8-byte aligned).
uint32_t raw_copy_serial(uint32_t c, uint8_t* d, const uint8_t* p, size_t n) {
  uint64_t c64 = c;
  for (; n >= 8; p += 8, d += 8, n -= 8) {
    const uint64_t v = load_le64(p);
    c64 = _mm_crc32_u64(c64, v);
    stream64(d, v);
  }
  c = static_cast<uint32_t>(c64);
  for (; n > 0; ++p, ++d, --n) {
    c = _mm_crc32_u8(c, *p);
    *d = *p;
  }
  return c;
}

// raw_hardware over `p`, copying it to `d`. The destination's first cache line boundary is
// reached byte by byte, so that every streamed line is written whole; the source may have any
// alignment (its loads are ordinary ones).
uint32_t raw_copy(uint32_t c, uint8_t* d, const uint8_t* p, size_t n) {
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(d) % 64) % 64);
  for (size_t i = 0; i < head; ++i) {
    c = _mm_crc32_u8(c, p[i]);
    d[i] = p[i];
  }
  p += head;
  d += head;
  n -= head;
#if defined(DTRAIN_CRC32C_FOLD)
  if (n >= kFoldMin) {
    c = raw_fold<true>(c, d, p, n);
    _mm_sfence();
    return c;
  }
#endif
  if (n >= 3 * kBlock) {
    const ShiftTable& table = shift_table();
    do {
      uint64_t c0 = c, c1 = 0, c2 = 0;
      const uint8_t* p1 = p + kBlock;
      const uint8_t* p2 = p + 2 * kBlock;
      uint8_t* d1 = d + kBlock;
      uint8_t* d2 = d + 2 * kBlock;
#if defined(__AVX__)
      // 32 bytes per chain per iteration, stored whole (fewer, wider streaming stores: 40%
      // faster than 8-byte ones on the AMD EPYC); the CRC takes its words from the same lines.
      for (size_t i = 0; i < kBlock; i += 32) {
        for (size_t k = 0; k < 32; k += 8) {
          c0 = _mm_crc32_u64(c0, load_le64(p + i + k));
          c1 = _mm_crc32_u64(c1, load_le64(p1 + i + k));
          c2 = _mm_crc32_u64(c2, load_le64(p2 + i + k));
        }
        stream256(d + i, p + i);
        stream256(d1 + i, p1 + i);
        stream256(d2 + i, p2 + i);
      }
#else
      for (size_t i = 0; i < kBlock; i += 8) {
        const uint64_t a = load_le64(p + i);
        const uint64_t b = load_le64(p1 + i);
        const uint64_t e = load_le64(p2 + i);
        c0 = _mm_crc32_u64(c0, a);
        c1 = _mm_crc32_u64(c1, b);
        c2 = _mm_crc32_u64(c2, e);
        stream64(d + i, a);
        stream64(d1 + i, b);
        stream64(d2 + i, e);
      }
#endif
      c = table.shift(table.shift(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1)) ^
          static_cast<uint32_t>(c2);
      p += 3 * kBlock;
      d += 3 * kBlock;
      n -= 3 * kBlock;
    } while (n >= 3 * kBlock);
  }
  c = raw_copy_serial(c, d, p, n);
  _mm_sfence();  // the streamed stores are visible to whatever the caller publishes next
  return c;
}
#endif

}  // namespace

uint32_t extend(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
#if defined(DTRAIN_CRC32C_FOLD)
  if (n >= kFoldMin) return ~raw_fold<false>(~crc, nullptr, p, n);
#endif
#if defined(__SSE4_2__)
  return ~raw_hardware(~crc, p, n);
#else
  return ~raw_software(~crc, p, n);
#endif
}

uint32_t extend_copy(uint32_t crc, void* dst, const void* src, size_t n) {
#if defined(DTRAIN_CRC32C_STREAMING_COPY)
  return ~raw_copy(~crc, static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n);
#else
  if (n > 0) std::memcpy(dst, src, n);
  return extend(crc, src, n);
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
uint32_t extend_chains(uint32_t crc, const void* data, size_t n) {
#if defined(__SSE4_2__)
  return ~raw_hardware(~crc, static_cast<const uint8_t*>(data), n);
#else
  return extend_software(crc, data, n);
#endif
}
}  // namespace detail

}  // namespace dtrain::crc32c
