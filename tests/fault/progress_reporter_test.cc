// ProgressReporter against an in-process coordination service: steps reach the progress key
// (first at once, then rate-limited), heartbeats carry the worker's task name, resumed keys, and
// from_environment() outside the launcher. Every wait is bounded.
#include "dtrain/fault/progress_reporter.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>

#include "dtrain/distribute/coordination.h"
#include "dtrain/train/step_observer.h"

namespace dtrain::fault {
namespace {

using namespace std::chrono_literals;

// Waits up to 5 s for `key` to hold `value`.
bool eventually(distribute::CoordinationClient& c, const std::string& key,
                const std::string& value) {
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto got = c.get_prefix(key);
    const auto it = got.find(key);
    if (it != got.end() && it->second == value) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

TEST(ProgressReporter, SendsTheNewestStepAndHeartbeats) {
  distribute::CoordinationServer server;
  distribute::CoordinationClient c(server.address());
  {
    ProgressReporter r({.address = server.address(),
                        .generation = 4,
                        .rank = 2,
                        .report_interval = 200ms,
                        .heartbeat_interval = 100ms});
    r.report(1);
    ASSERT_TRUE(eventually(c, "progress/4/2", "1"));  // the first one goes out at once
    for (int s = 2; s <= 100; ++s) r.report(s);
    EXPECT_TRUE(eventually(c, "progress/4/2", "100"));
    // last_sent() is updated after the store answered, so it may trail the value seen there.
    for (auto until = std::chrono::steady_clock::now() + 10s;
         r.last_sent() != 100 && std::chrono::steady_clock::now() < until;) {
      std::this_thread::sleep_for(10ms);
    }
    EXPECT_EQ(r.last_sent(), 100);
    const auto ages = c.heartbeat_ages();
    ASSERT_TRUE(ages.count("worker/4/2"));
    r.report_resumed(90, "ckpt-9");
    EXPECT_EQ(c.get("resumed/4/2", 1s), "90");
    EXPECT_EQ(c.get("resumed_from/4/2", 1s), "ckpt-9");
    r.report(101);
  }  // the destructor sends the last step
  EXPECT_EQ(c.get_prefix("progress/4/2").at("progress/4/2"), "101");
}

TEST(ProgressReporter, QueuedResumesGoOutInOrderOnTheReportersConnection) {
  distribute::CoordinationServer server;
  distribute::CoordinationClient c(server.address());
  ProgressReporter r({.address = server.address(), .generation = 4, .rank = 1});
  // What report_resume_to_launcher() calls once install_progress_reporter() has registered it.
  train::set_resume_observer([&r](int64_t generation, int64_t step, const std::string& ckpt) {
    r.queue_resumed(generation, step, ckpt);
  });
  EXPECT_TRUE(train::notify_resumed(7, 120, "snap-120"));
  r.queue_resumed(8, 130, "");
  // Waits on the service: both arrive without another step being reported.
  EXPECT_EQ(c.get("resumed/7/1", 5s), "120");
  EXPECT_EQ(c.get_prefix("resumed_from/7/1").at("resumed_from/7/1"), "snap-120");
  EXPECT_EQ(c.get("resumed/8/1", 5s), "130");
  EXPECT_TRUE(c.get_prefix("resumed_from/8/1").empty());  // no checkpoint named: no key
  train::set_resume_observer({});
  EXPECT_FALSE(train::notify_resumed(9, 140, "snap-140"));
}

TEST(ProgressReporter, IsNullOutsideTheLauncher) {
  ::unsetenv("DTRAIN_RANK");
  EXPECT_EQ(ProgressReporter::from_environment(), nullptr);
  EXPECT_EQ(install_progress_reporter(), nullptr);
  train::notify_step(5);  // no observer: nothing happens
  uninstall_progress_reporter();
}

TEST(ProgressReporter, KeysAreTheDocumentedOnes) {
  EXPECT_EQ(progress_key(3, 1), "progress/3/1");
  EXPECT_EQ(resumed_key(3, 1), "resumed/3/1");
  EXPECT_EQ(resumed_from_key(3, 1), "resumed_from/3/1");
  EXPECT_EQ(worker_heartbeat_task(3, 1), "worker/3/1");
}

}  // namespace
}  // namespace dtrain::fault
