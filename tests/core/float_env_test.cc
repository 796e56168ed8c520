// Flush-to-zero and denormals-are-zero: on by default on the main thread (set when the library
// loads), followed by start_thread() threads and ThreadPool workers, switched off and on by
// set_flush_denormals() and its guard, read from DTRAIN_FLUSH_DENORMALS (real child processes),
// and part of the build fingerprint.
#include "dtrain/core/float_env.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "dtrain/core/build_info.h"
#include "dtrain/core/error.h"
#include "dtrain/core/thread_pool.h"
#include "testutil/denormal_probe.h"
#include "testutil/expect_throws.h"

namespace dtrain {
namespace {

using testutil::denormal_times_big;
using testutil::tiny_product;

bool architecture_supported() {
#if defined(__x86_64__) || defined(__aarch64__)
  return true;
#else
  return false;
#endif
}

class FloatEnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!architecture_supported()) GTEST_SKIP() << "flush-denormals is a no-op here";
    if (std::getenv("DTRAIN_FLUSH_DENORMALS") != nullptr) {
      GTEST_SKIP() << "DTRAIN_FLUSH_DENORMALS is set; these tests check the default";
    }
  }
};

TEST_F(FloatEnvTest, MainThreadFlushesFromTheStartAndTheGuardTurnsItOff) {
  // Nothing has called into float_env yet: the load-time initializer set the main thread.
  EXPECT_TRUE(thread_flushes_denormals());
  EXPECT_EQ(denormal_times_big(), 0.0f);
  EXPECT_EQ(tiny_product(), 0.0f);
  EXPECT_TRUE(flush_denormals_enabled());
  {
    ScopedFlushDenormals exact(false);
    EXPECT_FALSE(flush_denormals_enabled());
    EXPECT_FALSE(thread_flushes_denormals());
    EXPECT_GT(denormal_times_big(), 1e-11f);
    EXPECT_GT(tiny_product(), 0.0f);
  }
  EXPECT_TRUE(flush_denormals_enabled());
  EXPECT_EQ(denormal_times_big(), 0.0f);
}

TEST_F(FloatEnvTest, StartThreadRunsWithTheProcessSettingNotTheCreators) {
  float flushed = -1, exact = -1;
  // The creator's register says "exact"; the process setting (on) wins.
  set_thread_flush_denormals(false);
  start_thread([&] { flushed = denormal_times_big(); }).join();
  set_thread_flush_denormals(true);
  EXPECT_EQ(flushed, 0.0f);
  {
    ScopedFlushDenormals guard(false);
    set_thread_flush_denormals(true);
    start_thread([&] { exact = denormal_times_big(); }).join();
  }
  EXPECT_GT(exact, 1e-11f);
}

// Runs one job of `n` indices on `pool` where every index waits for all the others, so that
// each runs on its own thread (the caller and every worker); returns the probe per index.
std::vector<float> probe_on_every_pool_thread(ThreadPool& pool) {
  const int n = pool.num_threads() + 1;
  std::vector<float> out(n, -1.0f);
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  pool.parallel_for(n, [&](int64_t i) {
    out[i] = denormal_times_big();
    std::unique_lock<std::mutex> lock(mu);
    ++arrived;
    cv.notify_all();
    // Bounded: a pool that ran two indices on one thread fails the test instead of hanging.
    EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return arrived == n; }))
        << "index " << i << " did not run beside the others";
  });
  return out;
}

TEST_F(FloatEnvTest, ThreadPoolWorkersFollowTheSettingAtEveryJob) {
  ThreadPool pool(2);
  for (float v : probe_on_every_pool_thread(pool)) EXPECT_EQ(v, 0.0f);
  {
    // The same workers, started while the setting was on, pick up "off" at the next job.
    ScopedFlushDenormals exact(false);
    for (float v : probe_on_every_pool_thread(pool)) EXPECT_GT(v, 1e-11f);
    ThreadPool started_off(2);
    for (float v : probe_on_every_pool_thread(started_off)) EXPECT_GT(v, 1e-11f);
  }
  for (float v : probe_on_every_pool_thread(pool)) EXPECT_EQ(v, 0.0f);
}

TEST_F(FloatEnvTest, FingerprintNamesTheBuildAndTheSetting) {
  const std::string on = build_fingerprint();
  EXPECT_NE(on.find("dtrain 0.1.0; "), std::string::npos) << on;
  EXPECT_NE(on.find("flush_denormals=on"), std::string::npos) << on;
  EXPECT_NE(on.find("-O"), std::string::npos) << on;
  const BuildInfo info = build_info();
  EXPECT_FALSE(info.compiler.empty());
  EXPECT_FALSE(info.isa.empty());
  ScopedFlushDenormals exact(false);
  const std::string off = build_fingerprint();
  EXPECT_NE(off.find("flush_denormals=off"), std::string::npos) << off;
  EXPECT_NE(on, off);
}

// The child side of the environment tests: runs only inside the processes they start.
TEST(FloatEnvChild, Report) {
  if (std::getenv("DTRAIN_FLOAT_ENV_CHILD") == nullptr) GTEST_SKIP() << "child process only";
  std::printf("main_thread_flushes=%d\n", thread_flushes_denormals() ? 1 : 0);
  std::printf("probe_nonzero=%d\n", denormal_times_big() != 0.0f ? 1 : 0);
  try {
    std::printf("enabled=%d\n", flush_denormals_enabled() ? 1 : 0);
  } catch (const InvalidArgumentError& e) {
    std::printf("invalid_argument=%s\n", e.what());
  }
  try {
    ThreadPool pool(1);
    std::printf("thread_pool=started\n");
  } catch (const InvalidArgumentError& e) {
    std::printf("thread_pool=invalid_argument\n");
  }
  std::fflush(stdout);
}

// Runs this test binary's FloatEnvChild.Report with DTRAIN_FLUSH_DENORMALS=`value` (unset when
// null) and returns what it printed.
std::string run_child(const char* value) {
  std::string cmd = value == nullptr ? "env -u DTRAIN_FLUSH_DENORMALS"
                                     : str_cat("env DTRAIN_FLUSH_DENORMALS='", value, "'");
  cmd += str_cat(" DTRAIN_FLOAT_ENV_CHILD=1 /proc/", ::getpid(),
                 "/exe --gtest_filter=FloatEnvChild.Report 2>&1");
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen " << cmd;
    return {};
  }
  std::string out;
  std::array<char, 4096> buf;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), p)) out.append(buf.data(), n);
  const int status = ::pclose(p);
  EXPECT_EQ(status, 0) << out;
  return out;
}

TEST(FloatEnvEnvironment, UnsetAndOneAreOnZeroIsOff) {
  if (!architecture_supported()) GTEST_SKIP() << "flush-denormals is a no-op here";
  for (const char* on : {static_cast<const char*>(nullptr), "1", "on"}) {
    const std::string out = run_child(on);
    EXPECT_NE(out.find("main_thread_flushes=1"), std::string::npos) << out;
    EXPECT_NE(out.find("probe_nonzero=0"), std::string::npos) << out;
    EXPECT_NE(out.find("enabled=1"), std::string::npos) << out;
  }
  const std::string off = run_child("0");
  EXPECT_NE(off.find("main_thread_flushes=0"), std::string::npos) << off;
  EXPECT_NE(off.find("probe_nonzero=1"), std::string::npos) << off;
  EXPECT_NE(off.find("enabled=0"), std::string::npos) << off;
  EXPECT_NE(off.find("thread_pool=started"), std::string::npos) << off;
}

TEST(FloatEnvEnvironment, MalformedValueIsAnInvalidArgumentNamingTheVariable) {
  const std::string out = run_child("sometimes");
  EXPECT_NE(out.find("invalid_argument=DTRAIN_FLUSH_DENORMALS=\"sometimes\" is not a valid"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("thread_pool=invalid_argument"), std::string::npos) << out;
  // The load-time initializer left the main thread as the hardware starts it.
  EXPECT_NE(out.find("main_thread_flushes=0"), std::string::npos) << out;
}

}  // namespace
}  // namespace dtrain
