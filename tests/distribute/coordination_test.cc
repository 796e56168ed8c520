// Coordination service: a real gRPC server on 127.0.0.1 (port 0) and real clients, as threads
// and as processes (this test binary re-executed as workers). Every wait has a timeout.
#include "dtrain/distribute/coordination.h"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/distribute/collectives.h"
#include "testutil/etcd_server.h"

extern char** environ;

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<std::string> keys(std::initializer_list<const char*> k) { return {k.begin(), k.end()}; }

// Runs fn(i) on n threads and joins them; rethrows nothing (tests assert inside).
template <class Fn>
void on_threads(int n, Fn fn) {
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) threads.emplace_back([&fn, i] { fn(i); });
  for (auto& t : threads) t.join();
}

// The service under test, with its state in memory ("memory") or in a real etcd on loopback
// ("etcd", skipped without /usr/bin/etcd): the same contract either way.
class CoordinationTest : public ::testing::TestWithParam<std::string> {
 protected:
  struct Server {
    std::unique_ptr<CoordinationServer> s;
    int port() const { return s->port(); }
    std::string address() const { return s->address(); }
    Membership membership() const { return s->membership(); }
    std::map<std::string, std::chrono::milliseconds> heartbeat_ages() const {
      return s->heartbeat_ages();
    }
  };
  void SetUp() override {
    CoordinationServerOptions o{.address = "127.0.0.1:0"};
    if (GetParam() == "etcd") {
      if (!testutil::have_etcd()) {
        GTEST_SKIP() << "no " << testutil::kEtcdBinary << " (Debian package etcd-server)";
      }
      etcd_ = std::make_unique<testutil::EtcdServer>();
      o.state_store = etcd_->url();
    }
    server_.s = std::make_unique<CoordinationServer>(o);
  }
  std::unique_ptr<testutil::EtcdServer> etcd_;  // outlives server_ (declared first)
  Server server_;
  CoordinationClientOptions fast_{.connect_timeout = 5s, .rpc_timeout = 5s};
};

TEST_P(CoordinationTest, ServerPicksAPortAndClientsConnect) {
  EXPECT_GT(server_.port(), 0);
  EXPECT_EQ(server_.address(), "127.0.0.1:" + std::to_string(server_.port()));
  CoordinationClient client(server_.address(), fast_);
  EXPECT_EQ(client.address(), server_.address());
  EXPECT_EQ(client.describe(), server_.address());
}

TEST_P(CoordinationTest, SetGetAddCheckWait) {
  CoordinationClient a(server_.address(), fast_);
  CoordinationClient b(server_.address(), fast_);
  const std::string binary("\0\1\xff\0z", 5);
  a.set("bytes", binary);
  EXPECT_EQ(b.get("bytes", 1s), binary);
  a.set("bytes", "replaced");
  EXPECT_EQ(b.get("bytes", 1s), "replaced");
  a.set("empty", "");
  EXPECT_EQ(b.get("empty", 1s), "");

  EXPECT_EQ(a.add("n", 2), 2);
  EXPECT_EQ(b.add("n", 5), 7);
  EXPECT_EQ(b.add("n", -10), -3);
  EXPECT_EQ(a.get("n", 1s), "-3");  // counters are decimal text

  EXPECT_TRUE(a.check(keys({"bytes", "n"})));
  EXPECT_FALSE(a.check(keys({"bytes", "missing"})));
  a.wait(keys({"bytes", "n", "empty"}), 1s);
}

TEST_P(CoordinationTest, AddOnATextValueIsInvalidArgument) {
  CoordinationClient c(server_.address(), fast_);
  c.set("text", "abc");
  EXPECT_THROW(c.add("text", 1), InvalidArgumentError);
  EXPECT_EQ(c.get("text", 1s), "abc");  // untouched
}

TEST_P(CoordinationTest, GetWaitsForALaterSet) {
  CoordinationClient reader(server_.address(), fast_);
  std::thread writer([&] {
    CoordinationClient w(server_.address(), fast_);
    std::this_thread::sleep_for(200ms);
    w.set("late", "value");
  });
  const auto start = Clock::now();
  EXPECT_EQ(reader.get("late", 10s), "value");
  EXPECT_GE(Clock::now() - start, 150ms);
  writer.join();
}

TEST_P(CoordinationTest, WaitWaitsForEveryKey) {
  CoordinationClient c(server_.address(), fast_);
  std::thread writer([&] {
    CoordinationClient w(server_.address(), fast_);
    w.set("k1", "1");
    std::this_thread::sleep_for(100ms);
    w.set("k2", "2");
  });
  c.wait(keys({"k1", "k2"}), 10s);
  EXPECT_TRUE(c.check(keys({"k1", "k2"})));
  writer.join();
}

TEST_P(CoordinationTest, GetAndWaitTimeOutWithDeadlineExceededNamingTheKey) {
  CoordinationClient c(server_.address(), fast_);
  const auto start = Clock::now();
  try {
    c.get("never", 200ms);
    FAIL() << "get returned";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("'never'"), std::string::npos) << e.what();
  }
  const auto took = Clock::now() - start;
  EXPECT_GE(took, 190ms);
  EXPECT_LT(took, 5s);
  c.set("here", "1");
  try {
    c.wait(keys({"here", "absent"}), 100ms);
    FAIL() << "wait returned";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("'absent'"), std::string::npos) << e.what();
  }
}

TEST_P(CoordinationTest, RanksAsThreadsRendezvousThroughTheStore) {
  constexpr int kRanks = 8;
  std::vector<std::vector<std::string>> seen(kRanks);
  on_threads(kRanks, [&](int rank) {
    CoordinationClient c(server_.address(), fast_);
    c.set("addr/" + std::to_string(rank), "host-" + std::to_string(rank));
    for (int r = 0; r < kRanks; ++r) seen[rank].push_back(c.get("addr/" + std::to_string(r), 10s));
    for (int i = 0; i < 50; ++i) c.add("counter", 1);
    c.barrier("done", kRanks, 10s);
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(seen[rank].size(), size_t{kRanks});
    for (int r = 0; r < kRanks; ++r) EXPECT_EQ(seen[rank][r], "host-" + std::to_string(r));
  }
  CoordinationClient c(server_.address(), fast_);
  EXPECT_EQ(c.add("counter", 0), kRanks * 50);
}

TEST_P(CoordinationTest, OneClientSharedByThreads) {
  CoordinationClient shared(server_.address(), fast_);
  on_threads(6, [&](int i) {
    // Every thread blocks in get until the last one sets its key: calls must not serialize.
    shared.set("t" + std::to_string(i), "x");
    for (int j = 0; j < 6; ++j) EXPECT_EQ(shared.get("t" + std::to_string(j), 10s), "x");
    shared.barrier("shared", 6, 10s);
  });
}

TEST_P(CoordinationTest, BarrierReleasesNobodyEarlyAndIsReusable) {
  constexpr int kRanks = 4;
  constexpr int kRounds = 5;
  std::atomic<int> arrivals{0};
  std::atomic<int> early{0};
  on_threads(kRanks, [&](int rank) {
    CoordinationClient c(server_.address(), fast_);
    for (int round = 1; round <= kRounds; ++round) {
      if (rank == round % kRanks) std::this_thread::sleep_for(50ms);  // a straggler per round
      arrivals.fetch_add(1);
      c.barrier("step", kRanks, 10s);
      if (arrivals.load() < round * kRanks) early.fetch_add(1);
      c.barrier("step-end", kRanks, 10s);
    }
  });
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(arrivals.load(), kRanks * kRounds);
}

TEST_P(CoordinationTest, BarrierTimeoutSaysWhoArrivedAndLeaves) {
  CoordinationClient c(server_.address(), fast_);
  try {
    c.barrier("b", 2, 200ms);
    FAIL() << "barrier returned";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2"), std::string::npos) << e.what();
  }
  // The timed-out caller left: two fresh callers complete the barrier, not one.
  on_threads(2, [&](int) {
    CoordinationClient t(server_.address(), fast_);
    t.barrier("b", 2, 10s);
  });
}

TEST_P(CoordinationTest, BarrierCountsMustAgree) {
  std::thread waiter([&] {
    CoordinationClient c(server_.address(), fast_);
    EXPECT_THROW(c.barrier("m", 3, 1s), DeadlineExceededError);
  });
  std::this_thread::sleep_for(200ms);
  CoordinationClient c(server_.address(), fast_);
  EXPECT_THROW(c.barrier("m", 2, 1s), InvalidArgumentError);
  waiter.join();
}

TEST_P(CoordinationTest, JoinFormsNumberedGenerations) {
  CoordinationClient observer(server_.address(), fast_);
  EXPECT_EQ(observer.generation(), 0);
  for (int64_t expected_generation = 1; expected_generation <= 2; ++expected_generation) {
    std::vector<Membership> got(3);
    on_threads(3, [&](int i) {
      CoordinationClient c(server_.address(), fast_);
      got[i] = c.join("node-" + std::to_string(2 - i), 3, 10s);
    });
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(got[i].generation, expected_generation);
      EXPECT_EQ(got[i].members, keys({"node-0", "node-1", "node-2"}));
      EXPECT_EQ(got[i].index_of("node-" + std::to_string(2 - i)), 2 - i);
    }
    EXPECT_EQ(observer.generation(), expected_generation);
    EXPECT_EQ(server_.membership().generation, expected_generation);
  }
  EXPECT_EQ(observer.heartbeat("anyone"), 2);  // heartbeats report the generation
}

TEST_P(CoordinationTest, JoinTimeoutNamesWhoJoinedAndLeavesTheRound) {
  CoordinationClient c(server_.address(), fast_);
  try {
    c.join("lonely", 2, 200ms);
    FAIL() << "join returned";
  } catch (const DeadlineExceededError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("lonely"), std::string::npos) << e.what();
  }
  std::vector<Membership> got(2);
  on_threads(2, [&](int i) {
    CoordinationClient t(server_.address(), fast_);
    got[i] = t.join(i == 0 ? "a" : "b", 2, 10s);
  });
  EXPECT_EQ(got[0].members, keys({"a", "b"}));  // "lonely" is not a member
  EXPECT_EQ(got[0].generation, 1);
}

TEST_P(CoordinationTest, JoinCountsMustAgree) {
  std::thread waiter([&] {
    CoordinationClient c(server_.address(), fast_);
    EXPECT_THROW(c.join("x", 3, 1s), DeadlineExceededError);
  });
  std::this_thread::sleep_for(200ms);
  CoordinationClient c(server_.address(), fast_);
  EXPECT_THROW(c.join("y", 2, 1s), InvalidArgumentError);
  waiter.join();
}

TEST_P(CoordinationTest, HeartbeatsAreRecordedAndSentInTheBackground) {
  CoordinationClient manual(server_.address(), fast_);
  manual.heartbeat("worker:0");
  CoordinationClientOptions bg = fast_;
  bg.heartbeat_task = "worker:1";
  bg.heartbeat_interval = 50ms;
  CoordinationClient background(server_.address(), bg);
  std::this_thread::sleep_for(400ms);
  const auto ages = manual.heartbeat_ages();
  ASSERT_EQ(ages.count("worker:0"), 1u);
  ASSERT_EQ(ages.count("worker:1"), 1u);
  EXPECT_GE(ages.at("worker:0"), 300ms);  // one heartbeat, long ago
  // Kept fresh by the thread: younger than the manual one, and seen fresh (one 50 ms interval
  // plus scheduling) within a generous deadline, so that a loaded machine cannot fail it.
  EXPECT_LT(ages.at("worker:1"), ages.at("worker:0"));
  bool fresh = false;
  for (auto deadline = std::chrono::steady_clock::now() + 10s;
       !fresh && std::chrono::steady_clock::now() < deadline; std::this_thread::sleep_for(20ms)) {
    fresh = manual.heartbeat_ages().at("worker:1") < 300ms;
  }
  EXPECT_TRUE(fresh) << "the background thread sent no heartbeat for 10 s";
  EXPECT_EQ(server_.heartbeat_ages().count("worker:1"), 1u);
  EXPECT_FALSE(background.heartbeat_failed());
}

TEST_P(CoordinationTest, GlooCollectivesRendezvousThroughTheCoordinator) {
  constexpr int kRanks = 3;
  std::vector<double> sums(kRanks, 0);
  std::vector<int64_t> generations(kRanks, 0);
  on_threads(kRanks, [&](int rank) {
    auto store = std::make_shared<CoordinationClient>(server_.address(), fast_);
    // A membership round gives the group its generation, hence fresh rendezvous keys.
    const Membership m = store->join("worker-" + std::to_string(rank), kRanks, 30s);
    auto collectives = Collectives::connect(store, {.rank = rank,
                                                    .world_size = kRanks,
                                                    .timeout = 30s,
                                                    .run_id = "coordination_test",
                                                    .generation = m.generation});
    sums[rank] = collectives->all_reduce_scalar(rank + 1, ReduceOp::kSum);
    generations[rank] = collectives->generation();
    collectives->barrier();
  });
  for (int rank = 0; rank < kRanks; ++rank) {
    EXPECT_EQ(sums[rank], 6.0);
    EXPECT_EQ(generations[rank], 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, CoordinationTest, ::testing::Values("memory", "etcd"),
                         [](const auto& info) { return info.param; });

// Two services (two launchers' worth) on one etcd and prefix serve one state: keys, counters,
// heartbeats and an elastic membership round span both; when one service is gone, the other
// forms the next generation alone, and a service started again rejoins the same state.
TEST(SharedCoordinationStateTest, ServicesOnOneEtcdShareTheStateAndOutliveEachOther) {
  if (!testutil::have_etcd()) {
    GTEST_SKIP() << "no " << testutil::kEtcdBinary << " (Debian package etcd-server)";
  }
  testutil::EtcdServer etcd;
  const CoordinationServerOptions o{
      .address = "127.0.0.1:0", .state_store = etcd.url(), .state_prefix = "job/"};
  const CoordinationClientOptions fast{.connect_timeout = 5s, .rpc_timeout = 5s};
  auto s0 = std::make_unique<CoordinationServer>(o);
  CoordinationServer s1(o);
  auto c0 = std::make_unique<CoordinationClient>(s0->address(), fast);
  CoordinationClient c1(s1.address(), fast);
  c0->set("k", "v");
  EXPECT_EQ(c1.get("k", 5s), "v");
  EXPECT_EQ(c0->add("n", 2), 2);
  EXPECT_EQ(c1.add("n", 3), 5);
  EXPECT_EQ(c1.get_prefix("k"), (std::map<std::string, std::string>{{"k", "v"}}));
  c0->heartbeat("node/0");
  bool seen = false;
  for (auto deadline = Clock::now() + 10s; !seen && Clock::now() < deadline;
       std::this_thread::sleep_for(20ms)) {
    seen = c1.heartbeat_ages().count("node/0") > 0;
  }
  EXPECT_TRUE(seen) << "a heartbeat through one service never reached the other";

  const JoinOptions elastic{.max_members = 2, .min_members = 1, .settle = 300ms, .timeout = 20s};
  std::vector<Membership> got(2);
  std::thread other([&] { got[1] = c1.join("node-1", elastic); });
  got[0] = c0->join("node-0", elastic);
  other.join();
  EXPECT_EQ(got[0].generation, 1);
  EXPECT_EQ(got[0].members, keys({"node-0", "node-1"}));
  EXPECT_EQ(got[1].members, got[0].members);
  EXPECT_EQ(s1.membership().generation, 1);

  // The first service goes away (its launcher died): the other carries on alone.
  c0.reset();
  s0.reset();
  const Membership alone = c1.join("node-1", elastic);
  EXPECT_EQ(alone.generation, 2);
  EXPECT_EQ(alone.members, keys({"node-1"}));
  EXPECT_EQ(c1.get("k", 1s), "v");

  // A service started again sees the same state and is seen waiting to join.
  CoordinationServer again(o);
  CoordinationClient c2(again.address(), fast);
  EXPECT_EQ(c2.generation(), 2);
  std::thread rejoin([&] { got[0] = c2.join("node-0", elastic); });
  bool waiting = false;
  for (auto deadline = Clock::now() + 10s; !waiting && Clock::now() < deadline;
       std::this_thread::sleep_for(10ms)) {
    waiting = c1.membership().joining == keys({"node-0"});
  }
  EXPECT_TRUE(waiting) << "the running member never saw the new one waiting";
  got[1] = c1.join("node-1", elastic);
  rejoin.join();
  EXPECT_EQ(got[0].generation, 3);
  EXPECT_EQ(got[0].members, keys({"node-0", "node-1"}));
  EXPECT_EQ(got[1].members, got[0].members);
}

TEST(CoordinationFailureTest, UnreachableServiceIsUnavailableNamingTheAddress) {
  std::string address;
  {
    CoordinationServer server({.address = "127.0.0.1:0"});
    address = server.address();
  }  // stopped: nothing listens there now
  const auto start = Clock::now();
  try {
    CoordinationClient c(address, {.connect_timeout = 300ms});
    FAIL() << "connected to a stopped server";
  } catch (const UnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find(address), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 5s);
}

TEST(CoordinationFailureTest, MalformedAddressIsInvalidArgument) {
  EXPECT_THROW(CoordinationClient("no-port", {.connect_timeout = 100ms}), InvalidArgumentError);
  EXPECT_THROW(CoordinationServer({.address = "127.0.0.1"}), InvalidArgumentError);
}

TEST(CoordinationFailureTest, PortInUseIsUnavailable) {
  CoordinationServer first({.address = "127.0.0.1:0"});
  try {
    CoordinationServer second({.address = first.address()});
    FAIL() << "two servers on one port";
  } catch (const UnavailableError& e) {
    EXPECT_NE(std::string(e.what()).find(first.address()), std::string::npos) << e.what();
  }
}

TEST(CoordinationFailureTest, ClientWaitsForAServerThatStartsLater) {
  std::string address;
  {
    CoordinationServer probe({.address = "127.0.0.1:0"});
    address = probe.address();
  }
  std::unique_ptr<CoordinationServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<CoordinationServer>(CoordinationServerOptions{.address = address});
  });
  CoordinationClient c(address, {.connect_timeout = 10s});
  starter.join();
  c.set("k", "v");
  EXPECT_EQ(c.get("k", 1s), "v");
}

TEST(CoordinationFailureTest, StoppingTheServerWakesBlockedCallsWithUnavailable) {
  CoordinationServer server({.address = "127.0.0.1:0"});
  CoordinationClient c(server.address(), {.connect_timeout = 5s});
  std::atomic<bool> unavailable{false};
  const auto start = Clock::now();
  std::thread blocked([&] {
    try {
      c.get("never", 30s);
    } catch (const UnavailableError&) {
      unavailable = true;
    }
  });
  std::this_thread::sleep_for(200ms);
  server.stop();
  blocked.join();
  EXPECT_TRUE(unavailable);
  EXPECT_LT(Clock::now() - start, 10s);
  EXPECT_THROW(c.set("k", "v"), UnavailableError);
}

TEST(CoordinationFailureTest, LostServiceFailsBackgroundHeartbeats) {
  auto server = std::make_unique<CoordinationServer>(CoordinationServerOptions{});
  std::atomic<bool> called{false};
  std::string message;
  CoordinationClient c(server->address(), {.connect_timeout = 5s,
                                           .rpc_timeout = 1s,
                                           .heartbeat_task = "worker:0",
                                           .heartbeat_interval = 50ms,
                                           .heartbeat_timeout = 300ms,
                                           .on_heartbeat_failure = [&](const Error& e) {
                                             message = e.what();
                                             called = true;
                                           }});
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(c.heartbeat_failed());
  const std::string address = server->address();
  server.reset();
  for (int i = 0; i < 100 && !called; ++i) std::this_thread::sleep_for(50ms);
  ASSERT_TRUE(called);
  EXPECT_TRUE(c.heartbeat_failed());
  EXPECT_NE(message.find(address), std::string::npos) << message;
}

// ---- Processes: this binary re-executed as workers -------------------------------------------

constexpr const char* kChildAddress = "DTRAIN_COORDINATION_TEST_ADDRESS";
constexpr const char* kChildRank = "DTRAIN_COORDINATION_TEST_RANK";
constexpr const char* kChildWorld = "DTRAIN_COORDINATION_TEST_WORLD";

// The worker's side; skipped unless started by the test below.
TEST(CoordinationProcessWorker, Worker) {
  const char* address = std::getenv(kChildAddress);
  if (address == nullptr) GTEST_SKIP() << "runs only as a child of ProcessesRendezvous";
  const int rank = std::atoi(std::getenv(kChildRank));
  const int world = std::atoi(std::getenv(kChildWorld));
  CoordinationClient c(
      address, {.connect_timeout = 10s, .heartbeat_task = "worker:" + std::to_string(rank)});
  const Membership m = c.join("worker-" + std::to_string(rank), world, 30s);
  ASSERT_EQ(m.generation, 1);
  ASSERT_EQ(static_cast<int>(m.members.size()), world);
  c.set("pid/" + std::to_string(rank), std::to_string(getpid()));
  for (int r = 0; r < world; ++r) c.get("pid/" + std::to_string(r), 30s);
  c.add("sum", rank + 1);
  c.barrier("end", world, 30s);
  ASSERT_EQ(c.get("sum", 1s), std::to_string(world * (world + 1) / 2));
}

TEST(CoordinationProcessTest, ProcessesRendezvousThroughTheCoordinator) {
  if (std::getenv(kChildAddress) != nullptr) GTEST_SKIP() << "child";
  constexpr int kWorld = 3;
  CoordinationServer server({.address = "127.0.0.1:0"});
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kWorld; ++rank) {
    std::vector<std::string> env_strings = {
        std::string(kChildAddress) + "=" + server.address(),
        std::string(kChildRank) + "=" + std::to_string(rank),
        std::string(kChildWorld) + "=" + std::to_string(kWorld)};
    std::vector<char*> envp;
    for (auto& s : env_strings) envp.push_back(s.data());
    for (char** e = environ; *e != nullptr; ++e) envp.push_back(*e);
    envp.push_back(nullptr);
    std::string self = "/proc/self/exe";
    std::string filter = "--gtest_filter=CoordinationProcessWorker.Worker";
    char* argv[] = {self.data(), filter.data(), nullptr};
    pid_t pid = 0;
    ASSERT_EQ(posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()), 0);
    pids.push_back(pid);
  }
  // Bounded wait: a worker that hangs is killed and fails the test.
  const auto deadline = Clock::now() + 60s;
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "worker pid " << pid;
  }
  EXPECT_EQ(server.membership().generation, 1);
  EXPECT_EQ(server.membership().members.size(), size_t{kWorld});
  EXPECT_EQ(server.heartbeat_ages().size(), size_t{kWorld});
}

}  // namespace
}  // namespace dtrain::distribute
