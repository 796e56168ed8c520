// The launcher's exclusion policy (src/fault/exclusion_policy.h): a slot (one node) or a node
// (several) that keeps failing within the window sits out; other failures do not count.
#include "fault/exclusion_policy.h"

#include <gtest/gtest.h>

namespace dtrain::fault {
namespace {

using namespace std::chrono_literals;

Failure of_slot(int slot, Clock::time_point at) {
  Failure f;
  f.slot = slot;
  f.ours = true;
  f.detected_at = at;
  return f;
}

TEST(ExclusionPolicy, ASlotFailingKTimesWithinTheWindowIsExcluded) {
  ExclusionPolicy p(3, /*multi_node=*/false, 2, 10);
  const auto t0 = Clock::now();
  EXPECT_EQ(p.active_slots(), (std::vector<int>{0, 1, 2}));
  EXPECT_FALSE(p.exclude_slot(of_slot(1, t0)));
  EXPECT_FALSE(p.exclude_slot(of_slot(2, t0 + 1s)));   // another slot
  EXPECT_FALSE(p.exclude_slot(of_slot(1, t0 + 11s)));  // the first fell out of the window
  EXPECT_TRUE(p.exclude_slot(of_slot(1, t0 + 12s)));
  EXPECT_EQ(p.active_slots(), (std::vector<int>{0, 2}));
  EXPECT_EQ(p.slots_left(), 2);
  EXPECT_FALSE(p.every_slot_excluded());
  EXPECT_EQ(p.slot_message(1), "slot 1 failed 2 times within 10 s: excluded (2 slot(s) left)");
}

TEST(ExclusionPolicy, OnlyThisNodesOwnFailuresOfASlotCount) {
  ExclusionPolicy p(2, false, 1, 60);
  const auto t0 = Clock::now();
  Failure remote = of_slot(0, t0);
  remote.ours = false;
  EXPECT_FALSE(p.exclude_slot(remote));
  Failure admit = of_slot(0, t0);
  admit.admit = true;
  EXPECT_FALSE(p.exclude_slot(admit));
  Failure no_slot = of_slot(0, t0);
  no_slot.slot.reset();
  EXPECT_FALSE(p.exclude_slot(no_slot));
  EXPECT_EQ(p.slots_left(), 2);
  EXPECT_TRUE(p.exclude_slot(of_slot(0, t0)));
  EXPECT_TRUE(p.exclude_slot(of_slot(1, t0)));
  EXPECT_TRUE(p.every_slot_excluded());
  EXPECT_TRUE(p.active_slots().empty());
}

TEST(ExclusionPolicy, ZeroNeverExcludes) {
  ExclusionPolicy p(1, false, 0, 60);
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(p.exclude_slot(of_slot(0, t0)));
  ExclusionPolicy nodes(1, true, 0, 60);
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(nodes.exclude_node(of_slot(0, t0), 1));
}

TEST(ExclusionPolicy, SeveralNodesExcludeTheNodeNotTheSlot) {
  ExclusionPolicy p(2, /*multi_node=*/true, 2, 60);
  const auto t0 = Clock::now();
  EXPECT_FALSE(p.exclude_slot(of_slot(0, t0)));
  EXPECT_FALSE(p.exclude_slot(of_slot(0, t0)));
  EXPECT_EQ(p.slots_left(), 2);
  Failure preempted = of_slot(0, t0);
  preempted.preemption = true;
  EXPECT_FALSE(p.exclude_node(preempted, 1));
  EXPECT_FALSE(p.exclude_node(preempted, 1));
  EXPECT_FALSE(p.exclude_node(of_slot(0, t0), 1));
  EXPECT_TRUE(p.exclude_node(of_slot(1, t0 + 1s), 1));
  EXPECT_EQ(p.node_message(1), "node 1 failed 2 times within 60 s: excluded from the job");
}

}  // namespace
}  // namespace dtrain::fault
