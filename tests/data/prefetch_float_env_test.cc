// The prefetch producer thread runs map functions with the process's flush-denormals setting,
// read when each pass starts its thread: 0 for a subnormal times a large float with the setting
// on, non-zero with it off.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "dtrain/core/float_env.h"
#include "dtrain/data/dataset.h"
#include "testutil/denormal_probe.h"

namespace dtrain::data {
namespace {

// One pass of a prefetched map: returns each element's probe, computed on the producer thread.
std::vector<float> probe_in_prefetch() {
  const std::thread::id consumer = std::this_thread::get_id();
  Dataset ds = Dataset::from_tensor_slices({Tensor::zeros({4})})
                   .map([consumer](Element) {
                     EXPECT_NE(std::this_thread::get_id(), consumer) << "not on the producer";
                     return Element{Tensor::scalar(testutil::denormal_times_big())};
                   })
                   .prefetch(2);
  std::vector<float> out;
  Iterator it = ds.iterator();
  Element e;
  while (it.next(e)) out.push_back(e[0].to_vector<float>()[0]);
  return out;
}

TEST(PrefetchFloatEnvTest, ProducerThreadRunsWithTheProcessSetting) {
#if !defined(__x86_64__) && !defined(__aarch64__)
  GTEST_SKIP() << "flush-denormals is a no-op here";
#endif
  if (std::getenv("DTRAIN_FLUSH_DENORMALS") != nullptr) {
    GTEST_SKIP() << "DTRAIN_FLUSH_DENORMALS is set; this test checks the default";
  }
  // The consumer's own register says "exact": the producer follows the process, not its creator.
  set_thread_flush_denormals(false);
  const std::vector<float> flushed = probe_in_prefetch();
  set_thread_flush_denormals(true);
  ASSERT_EQ(flushed.size(), 4u);
  for (float v : flushed) EXPECT_EQ(v, 0.0f);
  ScopedFlushDenormals exact(false);
  set_thread_flush_denormals(true);
  for (float v : probe_in_prefetch()) EXPECT_GT(v, 1e-11f);
}

}  // namespace
}  // namespace dtrain::data
