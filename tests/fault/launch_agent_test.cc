// The launcher agent's pure parts (exclusion window, --nnodes parsing, event JSON) and the
// coordination service's elastic membership rounds it relies on. Threads over one in-process
// service; every wait is bounded.
#include "dtrain/fault/launch_agent.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/fault/fault_events.h"

namespace dtrain::fault {
namespace {

using namespace std::chrono_literals;

TEST(FailureHistory, ExcludesAfterKFailuresWithinTheWindow) {
  FailureHistory h(2, 10s);
  const auto t0 = FailureHistory::Clock::now();
  EXPECT_FALSE(h.record(1, t0));
  EXPECT_FALSE(h.record(2, t0 + 1s));   // another slot
  EXPECT_FALSE(h.record(1, t0 + 11s));  // the first one fell out of the window
  EXPECT_TRUE(h.record(1, t0 + 12s));
  EXPECT_EQ(h.count(1, t0 + 12s), 2);
  FailureHistory never(0, 10s);
  EXPECT_FALSE(never.record(1, t0));
  EXPECT_FALSE(never.record(1, t0));
}

TEST(ParseNnodes, AcceptsNAndMinMax) {
  EXPECT_EQ(parse_nnodes("3"), std::make_pair(3, 3));
  EXPECT_EQ(parse_nnodes("1:4"), std::make_pair(1, 4));
  for (const char* bad : {"0", "4:1", "a", "1:", ":2", "1:2:3", "-1"}) {
    EXPECT_THROW(parse_nnodes(bad), InvalidArgumentError) << bad;
  }
}

TEST(FaultEvent, JsonHasTheKnownFieldsOnly) {
  FaultEvent e{.kind = kEventFailure, .generation = 3};
  e.rank = 1;
  e.signal = 9;
  e.exit_code = 137;
  e.detector = kDetectExit;
  e.message = "worker 1 exited on signal 9";
  const auto j = nlohmann::json::parse(to_json(e, 1700000000.5));
  EXPECT_EQ(j["kind"], "failure");
  EXPECT_EQ(j["generation"], 3);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["signal"], 9);
  EXPECT_EQ(j["exit_code"], 137);
  EXPECT_EQ(j["detector"], "exit");
  EXPECT_DOUBLE_EQ(j["time"].get<double>(), 1700000000.5);
  EXPECT_FALSE(j.contains("last_step"));
  EXPECT_FALSE(j.contains("stack"));
}

TEST(ElasticJoin, ClosesWithTheMinimumAfterTheSettleTime) {
  distribute::CoordinationServer server;
  distribute::CoordinationClient a(server.address()), b(server.address());
  const distribute::JoinOptions o{
      .max_members = 3, .min_members = 2, .settle = 300ms, .timeout = 10s};
  distribute::Membership ma, mb;
  std::thread t([&] { ma = a.join("node-0", o); });
  std::this_thread::sleep_for(50ms);
  const auto start = std::chrono::steady_clock::now();
  mb = b.join("node-1", o);
  t.join();
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
  EXPECT_EQ(ma.generation, 1);
  EXPECT_EQ(mb.members, (std::vector<std::string>{"node-0", "node-1"}));
  EXPECT_EQ(ma.members, mb.members);
  // A latecomer waits in the next round, and the running members can see it.
  std::thread late([&] {
    distribute::CoordinationClient c(server.address());
    EXPECT_THROW(
        c.join("node-2", {.max_members = 3, .min_members = 2, .settle = 0ms, .timeout = 500ms}),
        DeadlineExceededError);
  });
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(a.membership().joining, (std::vector<std::string>{"node-2"}));
  late.join();
  EXPECT_TRUE(a.membership().joining.empty());
}

TEST(ElasticJoin, AFullRoundClosesAtOnceAndCountsMustAgree) {
  distribute::CoordinationServer server;
  distribute::CoordinationClient a(server.address()), b(server.address());
  distribute::Membership ma;
  std::thread t([&] { ma = a.join("x", {.max_members = 2, .min_members = 1, .settle = 60s}); });
  std::this_thread::sleep_for(50ms);
  EXPECT_THROW(b.join("y", {.max_members = 3, .timeout = 1s}), InvalidArgumentError);
  const auto mb = b.join("y", {.max_members = 2, .min_members = 1, .settle = 60s, .timeout = 5s});
  t.join();
  EXPECT_EQ(mb.members.size(), 2u);
  EXPECT_EQ(ma.generation, mb.generation);
}

TEST(GetPrefix, ReturnsEveryKeyUnderThePrefix) {
  distribute::CoordinationServer server;
  distribute::CoordinationClient c(server.address());
  c.set("progress/2/0", "10");
  c.set("progress/2/1", "12");
  c.set("progress/20/0", "1");
  c.set("progress/3/0", "5");
  const auto got = c.get_prefix("progress/2/");
  EXPECT_EQ(got,
            (std::map<std::string, std::string>{{"progress/2/0", "10"}, {"progress/2/1", "12"}}));
  EXPECT_TRUE(c.get_prefix("nothing/").empty());
}

}  // namespace
}  // namespace dtrain::fault
