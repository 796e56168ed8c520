// Replica threads and gRPC handlers run with the process's flush-denormals setting: a subnormal
// times a large float is 0 on every replica with the setting on, non-zero with it off (picked up
// at the next step by replica threads started while it was on), and serve_call applies it to
// whatever thread gRPC runs a handler on.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "distribute/grpc_settings.h"
#include "dtrain/core/float_env.h"
#include "dtrain/distribute/mirrored_strategy.h"
#include "testutil/denormal_probe.h"

namespace dtrain::distribute {
namespace {

using testutil::denormal_times_big;

class StrategyFloatEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
#if !defined(__x86_64__) && !defined(__aarch64__)
    GTEST_SKIP() << "flush-denormals is a no-op here";
#endif
    if (std::getenv("DTRAIN_FLUSH_DENORMALS") != nullptr) {
      GTEST_SKIP() << "DTRAIN_FLUSH_DENORMALS is set; these tests check the default";
    }
  }
};

// The probe on each replica of one step; replicas 1.. run on the strategy's own threads.
std::vector<float> probe_replicas(MirroredStrategy& s) {
  std::vector<float> out(s.num_replicas_in_sync(), -1.0f);
  s.run([&](int replica) { out[replica] = denormal_times_big(); });
  return out;
}

TEST_F(StrategyFloatEnvTest, ReplicaThreadsFollowTheSettingAtEveryStep) {
  MirroredStrategy strategy(3, {.blas_threads = -1});
  for (float v : probe_replicas(strategy)) EXPECT_EQ(v, 0.0f);
  {
    ScopedFlushDenormals exact(false);
    for (float v : probe_replicas(strategy)) EXPECT_GT(v, 1e-11f);
    MirroredStrategy started_off(2, {.blas_threads = -1});
    for (float v : probe_replicas(started_off)) EXPECT_GT(v, 1e-11f);
  }
  for (float v : probe_replicas(strategy)) EXPECT_EQ(v, 0.0f);
}

TEST_F(StrategyFloatEnvTest, ServeCallRunsHandlersWithTheProcessSetting) {
  float in_handler = -1.0f;
  std::thread grpc_like([&] {
    set_thread_flush_denormals(false);  // a thread dtrain did not start, with exact arithmetic
    const grpc::Status status = serve_call([&] { in_handler = denormal_times_big(); });
    EXPECT_TRUE(status.ok());
  });
  grpc_like.join();
  EXPECT_EQ(in_handler, 0.0f);
}

}  // namespace
}  // namespace dtrain::distribute
