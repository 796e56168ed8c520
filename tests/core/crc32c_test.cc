#include "dtrain/core/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace dtrain {
namespace {

// Known answers: the CRC-32C check value, RFC 3720 B.4 vectors, LevelDB's crc32c_test.
TEST(Crc32c, KnownAnswers) {
  EXPECT_EQ(crc32c::value("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c::value(""), 0u);
  std::vector<uint8_t> buf(32, 0);
  EXPECT_EQ(crc32c::value(buf.data(), buf.size()), 0x8a9136aau);
  std::fill(buf.begin(), buf.end(), 0xff);
  EXPECT_EQ(crc32c::value(buf.data(), buf.size()), 0x62a8ab43u);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(crc32c::value(buf.data(), buf.size()), 0x46dd794eu);
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(crc32c::value(buf.data(), buf.size()), 0x113fdb5cu);
  // RFC 3720 B.4: an iSCSI read command PDU.
  const uint8_t iscsi[48] = {0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                             0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00,
                             0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00,
                             0x00, 0x18, 0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
                             0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(crc32c::value(iscsi, sizeof(iscsi)), 0xd9963a56u);
}

TEST(Crc32c, MaskMatchesTensorBoardVectorAndRoundTrips) {
  // TensorBoard's masked_crc.rs vector, taken from a real event file.
  const std::string s(
      "\x1a\x11"
      "CRC test, one two",
      19);
  EXPECT_EQ(crc32c::mask(crc32c::value(s)), 0x5794d08au);
  for (uint32_t c : {0u, 1u, 0xE3069283u, 0xffffffffu, 0xa282ead8u}) {
    EXPECT_EQ(crc32c::unmask(crc32c::mask(c)), c);
    EXPECT_NE(crc32c::mask(c), c);
  }
  // half_plus_three's tensor "a" = 0.5f: entry crc32c 0x1f273806 (formats.md §1.2).
  const float a = 0.5f;
  EXPECT_EQ(crc32c::mask(crc32c::value(&a, 4)), 0x1f273806u);
}

TEST(Crc32c, ExtendEqualsValueOfConcatenation) {
  std::string s = "hello world, this is a checkpoint";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    const uint32_t a = crc32c::value(s.data(), cut);
    EXPECT_EQ(crc32c::extend(a, s.data() + cut, s.size() - cut), crc32c::value(s));
  }
}

// Large, odd-sized, misaligned buffers exercise the three-chain hardware path and its joins, and
// (where the CPU folds with VPCLMULQDQ) the fold's thresholds: 256 bytes to start, 128 per round,
// 16-byte blocks and a byte tail after it; the table implementation is the oracle.
TEST(Crc32c, HardwarePathMatchesTableForAllSizesAndAlignments) {
  std::vector<uint8_t> buf(200000 + 16);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (auto& b : buf) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{255}, size_t{256},
                   size_t{257}, size_t{271}, size_t{383}, size_t{384}, size_t{399}, size_t{24575},
                   size_t{24576}, size_t{24577}, size_t{49152}, size_t{100003}, size_t{200000}}) {
    for (size_t off = 0; off < 9; off += 4) {
      const uint32_t want = crc32c::detail::extend_software(0x12345678u, buf.data() + off, n);
      EXPECT_EQ(crc32c::extend(0x12345678u, buf.data() + off, n), want)
          << "n=" << n << " off=" << off;
      EXPECT_EQ(crc32c::detail::extend_chains(0x12345678u, buf.data() + off, n), want)
          << "chains: n=" << n << " off=" << off;
    }
  }
}

// The copy with its CRC: the CRC of the table implementation, the same bytes as memcpy, for sizes
// around the three-chain rounds and the fold's thresholds and every alignment of source and
// destination against the cache lines (the destination's head is copied byte by byte up to a
// line boundary, the rest streamed).
TEST(Crc32c, ExtendCopyCopiesAndMatchesExtend) {
  std::vector<uint8_t> src(200000 + 128);
  uint64_t x = 0x2545F4914F6CDD1Dull;
  for (auto& b : src) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    b = static_cast<uint8_t>(x);
  }
  std::vector<uint8_t> dst(src.size() + 256);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{63}, size_t{64}, size_t{65}, size_t{319},
                   size_t{320}, size_t{321}, size_t{463}, size_t{24575}, size_t{24576},
                   size_t{24640}, size_t{49160}, size_t{100003}, size_t{200000}}) {
    for (size_t src_off : {size_t{0}, size_t{3}, size_t{8}, size_t{61}}) {
      for (size_t dst_off : {size_t{0}, size_t{1}, size_t{8}, size_t{37}, size_t{64}}) {
        std::fill(dst.begin(), dst.end(), uint8_t{0xEE});
        const uint32_t crc =
            crc32c::extend_copy(0x12345678u, dst.data() + dst_off, src.data() + src_off, n);
        ASSERT_EQ(crc, crc32c::detail::extend_software(0x12345678u, src.data() + src_off, n))
            << "n=" << n << " src_off=" << src_off << " dst_off=" << dst_off;
        ASSERT_TRUE(
            std::equal(src.begin() + src_off, src.begin() + src_off + n, dst.begin() + dst_off))
            << "n=" << n << " src_off=" << src_off << " dst_off=" << dst_off;
        // Nothing outside [dst_off, dst_off + n) is written.
        ASSERT_TRUE(
            std::all_of(dst.begin(), dst.begin() + dst_off, [](uint8_t b) { return b == 0xEE; }));
        ASSERT_TRUE(
            std::all_of(dst.begin() + dst_off + n, dst.end(), [](uint8_t b) { return b == 0xEE; }));
      }
    }
  }
}

TEST(Crc32c, DetectsEverySingleBitFlip) {
  std::vector<uint8_t> buf(4096, 0x5a);
  const uint32_t good = crc32c::value(buf.data(), buf.size());
  for (size_t i = 0; i < buf.size(); i += 61) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= static_cast<uint8_t>(1 << bit);
      EXPECT_NE(crc32c::value(buf.data(), buf.size()), good);
      buf[i] ^= static_cast<uint8_t>(1 << bit);
    }
  }
}

}  // namespace
}  // namespace dtrain
