#include "dtrain/core/random.h"

#include <gtest/gtest.h>

#include <cmath>

namespace dtrain {
namespace {

// Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32 10 rounds).
TEST(Philox, MatchesRandom123KnownAnswers) {
  uint32_t out[4];
  Philox::block(0, 0, out);
  EXPECT_EQ(out[0], 0x6627e8d5u);
  EXPECT_EQ(out[1], 0xe169c58du);
  EXPECT_EQ(out[2], 0xbc57ac4cu);
  EXPECT_EQ(out[3], 0x9b00dbd8u);
}

TEST(Philox, StateResumesTheStreamExactly) {
  Philox a(42);
  for (int i = 0; i < 7; ++i) a.next_u32();
  Philox b(a.state());
  for (int i = 0; i < 20; ++i) EXPECT_EQ(a.next_u32(), b.next_u32());
}

TEST(Philox, UniformAndNormalHaveTheRightMoments) {
  Philox r(1);
  double sum = 0, sum2 = 0, nsum = 0, nsum2 = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum2 += u * u;
    const double z = r.normal();
    nsum += z;
    nsum2 += z * z;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(sum2 / n - 0.25, 1.0 / 12, 0.003);
  EXPECT_NEAR(nsum / n, 0.0, 0.01);
  EXPECT_NEAR(nsum2 / n, 1.0, 0.02);
}

TEST(Philox, UniformIntStaysInRange) {
  Philox r(3);
  int counts[7] = {};
  for (int i = 0; i < 70000; ++i) {
    const uint64_t k = r.uniform_int(7);
    ASSERT_LT(k, 7u);
    ++counts[k];
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 500);
}

}  // namespace
}  // namespace dtrain
