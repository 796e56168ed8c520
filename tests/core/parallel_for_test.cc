// parallel_for: every index exactly once in ranges that start on grain boundaries, inline below
// two grains and inside a parallel region, one range per team thread above, the
// flush-denormals setting followed on the team's threads, and callers on several threads at
// once.
#include "dtrain/core/parallel_for.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/core/float_env.h"
#include "testutil/expect_throws.h"

namespace dtrain {
namespace {

// Sets the team size for one test and restores it.
class ScopedThreads {
 public:
  explicit ScopedThreads(int n) : previous_(intra_op_threads()) { set_intra_op_threads(n); }
  ~ScopedThreads() { set_intra_op_threads(previous_); }

 private:
  int previous_;
};

struct Ranges {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::set<std::thread::id> threads;
};

Ranges run(int64_t n, int64_t grain) {
  Ranges r;
  std::mutex mu;
  parallel_for(n, grain, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    r.ranges.emplace_back(begin, end);
    r.threads.insert(std::this_thread::get_id());
  });
  std::sort(r.ranges.begin(), r.ranges.end());
  return r;
}

TEST(ParallelFor, CoversEveryIndexOnceInRangesStartingOnGrainBoundaries) {
  for (int threads : {1, 2, 3, 4, 7}) {
    ScopedThreads scoped(threads);
    for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 1000, 4097}) {
      for (int64_t grain : {1, 3, 16, 64}) {
        const Ranges r = run(n, grain);
        SCOPED_TRACE(testing::Message() << threads << " threads, n " << n << ", grain " << grain);
        ASSERT_FALSE(r.ranges.empty());
        int64_t next = 0;
        for (const auto& [begin, end] : r.ranges) {
          EXPECT_EQ(begin, next);
          EXPECT_LT(begin, end);
          EXPECT_EQ(begin % grain, 0);
          next = end;
        }
        EXPECT_EQ(next, n);
        EXPECT_LE(static_cast<int64_t>(r.ranges.size()), threads);
      }
    }
  }
}

TEST(ParallelFor, SplitsOverTheWholeTeamAboveTwoGrains) {
  for (int threads : {2, 3}) {
    ScopedThreads scoped(threads);
    const Ranges r = run(100 * threads, 10);
    EXPECT_EQ(static_cast<int>(r.ranges.size()), threads);
    EXPECT_EQ(static_cast<int>(r.threads.size()), threads);
    EXPECT_TRUE(r.threads.count(std::this_thread::get_id()));  // the caller takes a range
  }
}

TEST(ParallelFor, RunsInlineBelowTwoGrainsWithOneThreadAndForNothing) {
  ScopedThreads scoped(4);
  Ranges r = run(19, 10);  // one range: 19 < 2 grains
  ASSERT_EQ(r.ranges.size(), 1u);
  EXPECT_EQ(r.ranges[0], std::make_pair(int64_t{0}, int64_t{19}));
  EXPECT_EQ(*r.threads.begin(), std::this_thread::get_id());
  int calls = 0;
  parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
  parallel_for(-5, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
  set_intra_op_threads(1);
  r = run(1000, 1);
  ASSERT_EQ(r.ranges.size(), 1u);
  EXPECT_EQ(*r.threads.begin(), std::this_thread::get_id());
}

TEST(ParallelFor, ANestedCallRunsInlineOnTheOuterRangesThread) {
  ScopedThreads scoped(2);
  std::atomic<int> inner_ranges{0};
  std::atomic<int> foreign{0};
  parallel_for(64, 16, [&](int64_t, int64_t) {
    const auto outer = std::this_thread::get_id();
    parallel_for(1000, 1, [&](int64_t begin, int64_t end) {
      ++inner_ranges;
      if (std::this_thread::get_id() != outer || begin != 0 || end != 1000) ++foreign;
    });
  });
  EXPECT_EQ(inner_ranges.load(), 2);
  EXPECT_EQ(foreign.load(), 0);
}

TEST(ParallelFor, TheTeamFollowsTheFlushDenormalsSetting) {
  ScopedThreads scoped(2);
  for (bool on : {false, true}) {
    ScopedFlushDenormals guard(on);
    std::atomic<int> agree{0};
    parallel_for(2, 1, [&](int64_t, int64_t) {
      if (thread_flushes_denormals() == on) ++agree;
    });
    EXPECT_EQ(agree.load(), 2) << "flush denormals " << on;
  }
}

TEST(ParallelFor, CallersOnSeveralThreadsEachGetTheirWholeRange) {
  ScopedThreads scoped(2);
  constexpr int kCallers = 3;
  constexpr int64_t kN = 10000;
  std::vector<std::vector<int>> hits(kCallers, std::vector<int>(kN, 0));
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.push_back(start_thread([&, c] {
      for (int round = 0; round < 50; ++round) {
        parallel_for(kN, 100, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) ++hits[c][i];
        });
      }
    }));
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) {
    EXPECT_EQ(std::count(hits[c].begin(), hits[c].end(), 50), kN) << "caller " << c;
  }
}

TEST(ParallelFor, ATeamOfNoThreadsIsRefused) {
  testutil::expect_throws_with<InvalidArgumentError>([] { set_intra_op_threads(0); },
                                                     {"set_intra_op_threads", "at least one"});
  EXPECT_GE(intra_op_threads(), 1);
}

}  // namespace
}  // namespace dtrain
