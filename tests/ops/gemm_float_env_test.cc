// OpenBLAS's worker threads, created when libopenblas loads (before any dtrain code runs), run
// with the process's flush-denormals setting: a 2-thread sgemm of subnormal inputs by large ones
// is exactly zero everywhere with the setting on (every element, whichever thread computed
// it), and non-zero everywhere with it off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "dtrain/core/float_env.h"
#include "dtrain/ops/gemm.h"

namespace dtrain::ops {
namespace {

// C [n, n] = A [n, n] · B [n, n] with A all subnormal (1e-40) and B all 1e30: each element is
// n * 1e-10 in exact arithmetic, 0 when the thread that computed it treats denormals as zero.
// n = 384: far above OpenBLAS's threshold for splitting an sgemm over its threads.
std::vector<float> subnormal_gemm() {
  constexpr int64_t n = 384;
  std::vector<float> a(n * n, 1e-40f), b(n * n, 1e30f), c(n * n, -1.0f);
  gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  return c;
}

// Elements of `c` that are (not) zero.
int64_t count_zero(const std::vector<float>& c) {
  int64_t z = 0;
  for (float v : c) z += v == 0.0f;
  return z;
}

class GemmFloatEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(__x86_64__) && !defined(__aarch64__)
    GTEST_SKIP() << "flush-denormals is a no-op here";
#endif
    if (std::getenv("DTRAIN_FLUSH_DENORMALS") != nullptr) {
      GTEST_SKIP() << "DTRAIN_FLUSH_DENORMALS is set; this test checks the default";
    }
    previous_threads_ = num_threads();
    set_num_threads(2);
  }
  void TearDown() override {
    if (previous_threads_ > 0) set_num_threads(previous_threads_);
  }
  int previous_threads_ = -1;
};

TEST_F(GemmFloatEnvTest, OpenBlasWorkersFlushWithTheSettingOnAndNotWithItOff) {
  ASSERT_TRUE(flush_denormals_enabled());
  const std::vector<float> flushed = subnormal_gemm();
  EXPECT_EQ(count_zero(flushed), static_cast<int64_t>(flushed.size()))
      << "some rows or columns were computed by a thread without FTZ|DAZ";
  {
    ScopedFlushDenormals exact(false);
    const std::vector<float> c = subnormal_gemm();
    EXPECT_EQ(count_zero(c), 0) << "some elements were computed by a thread still flushing";
    EXPECT_NEAR(c[0], 384e-10f, 1e-12f);
  }
  EXPECT_EQ(count_zero(subnormal_gemm()), static_cast<int64_t>(flushed.size()));
}

}  // namespace
}  // namespace dtrain::ops
