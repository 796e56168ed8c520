// The launcher's failure classification (src/fault/failure_classifier.h): what an exit, a
// stalled step, a silent heartbeat or a lost node means, and which exit comes first.
#include "fault/failure_classifier.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <csignal>

namespace dtrain::fault {
namespace {

using namespace std::chrono_literals;

// A worker of rank `rank` that ended with waitpid status `status`.
Worker exited(int rank, int status) {
  Worker w;
  w.rank = rank;
  w.slot = rank + 10;
  w.pid = 1000 + rank;
  w.status = status;
  w.code = exit_code_of(status);
  return w;
}
int by_code(int code) { return W_EXITCODE(code, 0); }
int by_signal(int sig) { return W_EXITCODE(0, sig); }

TEST(FailureClassifier, DescribesExitsAsShellsDo) {
  EXPECT_EQ(describe_exit(by_code(7)), "exited with code 7");
  EXPECT_EQ(describe_exit(by_signal(SIGKILL)),
            std::string("exited on signal 9 (") + strsignal(SIGKILL) + ")");
  EXPECT_EQ(exit_code_of(by_signal(SIGKILL)), 137);
}

TEST(FailureClassifier, AnExitIsAFailureOfItsWorker) {
  Worker w = exited(2, by_signal(SIGKILL));
  w.step = 40;
  const auto now = Clock::now();
  const Failure f = exit_failure(w, 3, 143, now);
  EXPECT_EQ(f.rank, 2);
  EXPECT_EQ(f.slot, 12);
  EXPECT_EQ(f.node, 3);
  EXPECT_EQ(f.pid, 1002);
  EXPECT_EQ(f.code, 137);
  EXPECT_EQ(f.signal, SIGKILL);
  EXPECT_EQ(f.last_step, 40);
  EXPECT_EQ(f.detected_at, now);
  EXPECT_TRUE(f.ours);
  EXPECT_FALSE(f.preemption);
  EXPECT_EQ(f.detector, kDetectExit);
  EXPECT_EQ(f.what, describe_exit(w.status).insert(0, "worker 2 ") + " at step 40");
}

TEST(FailureClassifier, CollectiveErrorsAndThePreemptionCodeAreRecognized) {
  const Failure collective = exit_failure(exited(0, by_code(kUnavailableCode)), 0, 143, {});
  EXPECT_EQ(collective.detector, kDetectCollective);
  EXPECT_NE(collective.what.find("(a collective failed)"), std::string::npos);
  EXPECT_EQ(exit_failure(exited(0, by_code(kDeadlineCode)), 0, 143, {}).detector,
            kDetectCollective);
  EXPECT_TRUE(exit_failure(exited(0, by_code(77)), 0, 77, {}).preemption);
  EXPECT_FALSE(exit_failure(exited(0, by_code(77)), 0, 143, {}).preemption);
  EXPECT_FALSE(exit_failure(exited(0, by_code(3)), 0, 143, {}).signal.has_value());
}

TEST(FailureClassifier, AKillComesBeforeFailuresBeforeCollectiveErrorsBeforeCleanExits) {
  std::vector<Worker> w = {exited(0, by_code(0)), exited(1, by_code(kUnavailableCode)),
                           exited(2, by_code(1)), exited(3, by_signal(SIGTERM)),
                           exited(4, by_signal(SIGKILL))};
  std::vector<Worker*> reaped;
  for (auto& x : w) reaped.push_back(&x);
  order_by_exit_priority(reaped);
  std::vector<int> ranks;
  for (const Worker* x : reaped) ranks.push_back(x->rank);
  EXPECT_EQ(ranks, (std::vector<int>{4, 2, 3, 1, 0}));  // stable among equals
}

TEST(FailureClassifier, PeersStoppedByTheLauncherAreNotPeerFailures) {
  EXPECT_TRUE(is_peer_failure(exited(0, by_code(kUnavailableCode)), 143));
  EXPECT_TRUE(is_peer_failure(exited(0, by_code(1)), 143));
  EXPECT_FALSE(is_peer_failure(exited(0, by_code(143)), 143));      // preempted
  EXPECT_FALSE(is_peer_failure(exited(0, by_code(75)), 75));        // preempted, own code
  EXPECT_FALSE(is_peer_failure(exited(0, by_code(128 + 15)), 75));  // exited as on SIGTERM
  EXPECT_FALSE(is_peer_failure(exited(0, by_signal(SIGTERM)), 143));
  EXPECT_FALSE(is_peer_failure(exited(0, by_signal(SIGKILL)), 143));  // after the grace period
}

TEST(FailureClassifier, AStalledStepIsCaughtByTheWatchdog) {
  const auto now = Clock::now();
  Worker w;
  w.rank = 1;
  w.pid = 99;
  w.step = 7;
  w.step_changed = now - 3s;
  const HangLimits limits{.watchdog_timeout_s = 2, .heartbeat_timeout_s = 10};
  const auto f = detect_hang(w, 0, now, 1s, limits);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->detector, kDetectWatchdog);
  EXPECT_NEAR(*f->detection_latency, 3.0, 1e-6);
  EXPECT_EQ(f->code, 128 + SIGKILL);
  EXPECT_EQ(f->what, "worker 1 made no progress for 3.0 s at step 7 (watchdog)");
  // Not stalled long enough, watchdog off, or no step reported yet: no hang.
  EXPECT_FALSE(detect_hang(w, 0, now - 2s, 1s, limits).has_value());
  EXPECT_FALSE(detect_hang(w, 0, now, 1s, {.watchdog_timeout_s = 0, .heartbeat_timeout_s = 10}));
  w.step.reset();
  EXPECT_FALSE(detect_hang(w, 0, now, 1s, limits).has_value());
}

TEST(FailureClassifier, ASilentWorkerIsCaughtByItsHeartbeat) {
  const auto now = Clock::now();
  Worker w;
  w.rank = 2;
  w.step_changed = now;
  const HangLimits limits{.watchdog_timeout_s = 0, .heartbeat_timeout_s = 2};
  const auto f = detect_hang(w, 0, now, 2500ms, limits);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->detector, kDetectHeartbeat);
  EXPECT_EQ(f->what, "worker 2 sent no heartbeat for 2.5 s");
  EXPECT_FALSE(detect_hang(w, 0, now, 2000ms, limits).has_value());
  EXPECT_FALSE(detect_hang(w, 0, now, std::nullopt, limits).has_value());  // sends none
}

TEST(FailureClassifier, AStoppedWorkerIsTheFirstSuspectThenTheSlowest) {
  const auto now = Clock::now();
  std::vector<Worker> w(4);
  for (int i = 0; i < 4; ++i) {
    w[i].rank = i;
    w[i].pid = 100 + i;
    w[i].step_changed = now;
  }
  w[0].step = 10;
  w[1].step = 8;
  w[2].step = 9;
  w[3].step = 10;
  w[3].step_changed = now - 1s;
  std::vector<Worker*> order;
  for (auto& x : w) order.push_back(&x);
  order_hang_suspects(order, [](pid_t pid) { return pid == 102; });
  std::vector<int> ranks;
  for (const Worker* x : order) ranks.push_back(x->rank);
  EXPECT_EQ(ranks, (std::vector<int>{2, 1, 3, 0}));
}

TEST(FailureClassifier, NodesAndSignals) {
  const auto now = Clock::now();
  EXPECT_FALSE(detect_lost_node(1, 900ms, 1, now, 5).has_value());
  EXPECT_FALSE(detect_lost_node(1, 9000ms, 0, now, 5).has_value());  // heartbeats off
  const auto lost = detect_lost_node(1, 1500ms, 1, now, 5);
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->node, 1);
  EXPECT_EQ(lost->detector, kDetectHeartbeat);
  EXPECT_EQ(lost->last_step, 5);
  EXPECT_FALSE(lost->ours);

  // A member node whose launcher waits to join again: its workers are gone (not an admission).
  const Failure rejoined = rejoined_node(1, now, 5);
  EXPECT_EQ(rejoined.node, 1);
  EXPECT_FALSE(rejoined.rank.has_value());
  EXPECT_FALSE(rejoined.admit);
  EXPECT_NE(rejoined.code, 0);
  EXPECT_EQ(rejoined.last_step, 5);
  EXPECT_NE(rejoined.what.find("node 1's launcher started again"), std::string::npos);

  const Failure admit = admit_request("node-2", 2, 3, now, 5);
  EXPECT_TRUE(admit.admit);
  EXPECT_EQ(admit.code, 0);
  EXPECT_EQ(admit.what, "node-2 is waiting to join (2 of at most 3 nodes running)");

  const Failure service = lost_service_failure(1, "deadline", now, 5);
  EXPECT_TRUE(service.lost_service);
  EXPECT_EQ(service.code, kUnavailableCode);

  const Failure sig = signal_failure(0, SIGTERM, now);
  EXPECT_TRUE(sig.preemption);
  EXPECT_EQ(sig.code, 128 + SIGTERM);
  EXPECT_EQ(sig.detector, "signal");
}

}  // namespace
}  // namespace dtrain::fault
