// OverlappedGradientReduction and Collectives::all_reduce_in_order with ranks as threads on
// loopback: bitwise the sums of Collectives::all_reduce for any bucketing (2, 3 and 4 workers,
// tensors that share a bucket, tensors larger than a bucket and than Gloo's 1 MiB segment),
// buckets reduced before finish() (the overlap), zeros for gradients that never came; over shared
// memory (the buckets reduced on the backward thread) and over Gloo (a communication thread).
#include "dtrain/distribute/gradient_overlap.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "dtrain/core/error.h"
#include "testutil/ranks.h"

namespace dtrain::distribute {
namespace {

using namespace std::chrono_literals;

using testutil::run_ranks;

// Values whose sums round differently in different orders: magnitudes spread over 2^±12.
Tensor values(int rank, int64_t n, int salt) {
  Tensor t(Shape{n});
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const double u = std::sin(1e-3 * static_cast<double>(i * 7919 + rank * 104729 + salt * 31));
    p[i] = static_cast<float>(u * std::ldexp(1.0, static_cast<int>((i + rank) % 25) - 12));
  }
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

struct Param {
  int workers;
  size_t collective_bucket_bytes;  // CollectiveOptions::bucket_bytes (the reference's packing)
  size_t overlap_bucket_bytes;
  bool shared_memory = true;  // false: Gloo's pairs, and the communication thread
};

class OverlapTest : public ::testing::TestWithParam<Param> {};

TEST_P(OverlapTest, SumsAreBitwiseThoseOfOneAllReduce) {
  const Param p = GetParam();
  // Small tensors packed together, one larger than the collective bucket, one larger than
  // Gloo's 1 MiB segment (several segments per chunk), and an odd-sized tail.
  const std::vector<int64_t> sizes = {5, 300, 1, 4000, 17, 300000, 33};
  int differing = 0;  // elements whose order-dependent sum differs from a rank-order sum
  run_ranks(p.workers,
            [&](int r, Collectives& c) {
              for (int step = 0; step < 2; ++step) {
                std::vector<Tensor> reference, grads, out;
                for (size_t k = 0; k < sizes.size(); ++k) {
                  grads.push_back(values(r, sizes[k], static_cast<int>(k) + 100 * step));
                  reference.push_back(grads.back().clone());
                  out.push_back(Tensor(Shape{sizes[k]}));
                }
                Tensor flags = Tensor::from_vector<float>({r == 1 ? 1.0f : 0.0f, 2.0f}, {2});
                reference.push_back(flags.clone());
                std::vector<Tensor> extra = {flags};
                c.all_reduce(reference, ReduceOp::kSum);
                OverlappedGradientReduction overlap(c, out, extra, p.overlap_bucket_bytes);
                // Backward finishes the last variables first.
                for (size_t k = sizes.size(); k-- > 0;) overlap.gradient_ready(k, grads[k]);
                overlap.finish();
                for (size_t k = 0; k < sizes.size(); ++k) {
                  ASSERT_TRUE(same_bits(out[k], reference[k]))
                      << "rank " << r << " tensor " << k << " step " << step;
                }
                ASSERT_TRUE(same_bits(flags, reference.back()));
                EXPECT_EQ(flags.to_vector<float>()[0], 1.0f);
                EXPECT_EQ(flags.to_vector<float>()[1], 2.0f * p.workers);
                if (r == 0 && step == 0) {
                  // The test has teeth: the plain rank-order sum differs somewhere.
                  for (size_t k = 0; k < sizes.size(); ++k) {
                    Tensor s = values(0, sizes[k], static_cast<int>(k));
                    for (int q = 1; q < p.workers; ++q) {
                      const Tensor x = values(q, sizes[k], static_cast<int>(k));
                      for (int64_t i = 0; i < sizes[k]; ++i)
                        s.data<float>()[i] += x.data<float>()[i];
                    }
                    for (int64_t i = 0; i < sizes[k]; ++i) {
                      if (s.data<float>()[i] != out[k].data<float>()[i]) ++differing;
                    }
                  }
                }
              }
            },
            {.bucket_bytes = p.collective_bucket_bytes, .shared_memory = p.shared_memory});
  if (p.workers >= 3) {
    EXPECT_GT(differing, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Bucketings, OverlapTest,
                         ::testing::Values(Param{2, 4096, 64}, Param{3, 4096, 64},
                                           Param{3, 4096, 5000}, Param{3, size_t{4} << 20, 1},
                                           Param{3, size_t{4} << 20, size_t{1} << 30},
                                           Param{4, 4096, 2000}, Param{4, size_t{4} << 20, 64},
                                           Param{2, 4096, 64, false}, Param{3, 4096, 64, false},
                                           Param{3, 4096, 5000, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.workers) + "workers_collective" +
                                  std::to_string(info.param.collective_bucket_bytes) + "_overlap" +
                                  std::to_string(info.param.overlap_bucket_bytes) +
                                  (info.param.shared_memory ? "_shm" : "_gloo");
                         });

// Threads of this process, from /proc/self/task.
int thread_count() {
  int n = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/task")) ++n;
  return n;
}

// Over shared memory a reduction is copying and adding on the CPU: with no communication thread
// to compete with backward for the cores, finish() reduces every bucket in one collective on the
// thread that ran backward. Over Gloo the thread overlaps the wire's latency with backward.
TEST(OverlapTest, OverSharedMemoryTheBackwardThreadReducesTheBuckets) {
  for (const bool shared_memory : {true, false}) {
    std::atomic<int> added{0};
    run_ranks(2,
              [&](int r, Collectives& c) {
                EXPECT_EQ(c.uses_shared_memory(), shared_memory);
                std::vector<Tensor> grads = {values(r, 100, 1), values(r, 100, 2)};
                std::vector<Tensor> out = {Tensor(Shape{100}), Tensor(Shape{100})};
                c.barrier();  // both ranks' transports are up: only the overlap starts threads now
                const int before = thread_count();
                c.barrier();
                OverlappedGradientReduction overlap(c, out, {}, 64);
                c.barrier();
                if (r == 0) added = thread_count() - before;
                c.barrier();
                overlap.gradient_ready(1, grads[1]);
                if (shared_memory) {
                  // Not reduced yet: every bucket goes in finish()'s one collective.
                  EXPECT_EQ(overlap.buckets_reduced(), 0u);
                }
                overlap.gradient_ready(0, grads[0]);
                overlap.finish();
                EXPECT_EQ(overlap.buckets_reduced(), 2u);
                c.barrier();
              },
              {.shared_memory = shared_memory});
    EXPECT_EQ(added.load(), shared_memory ? 0 : 2) << (shared_memory ? "shm" : "gloo");
  }
}

TEST(OverlapTest, ABucketIsReducedWhileLaterGradientsAreStillMissing) {
  // Over Gloo: its communication thread (over shared memory the buckets wait for finish()).
  run_ranks(
      2,
      [&](int r, Collectives& c) {
        std::vector<Tensor> grads = {values(r, 100, 1), values(r, 100, 2)};
        std::vector<Tensor> out = {Tensor(Shape{100}), Tensor(Shape{100})};
        OverlappedGradientReduction overlap(c, out, {}, 64);  // one bucket per variable
        ASSERT_EQ(overlap.buckets().size(), 2u);
        EXPECT_EQ(overlap.buckets()[0], std::vector<size_t>{1});
        overlap.gradient_ready(1, grads[1]);
        const auto deadline = std::chrono::steady_clock::now() + 60s;
        while (overlap.buckets_reduced() == 0 && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(1ms);
        }
        EXPECT_EQ(overlap.buckets_reduced(), 1u)
            << "the first bucket waited for the whole backward";
        overlap.gradient_ready(0, grads[0]);
        overlap.finish();
        EXPECT_EQ(overlap.buckets_reduced(), 2u);
      },
      {.shared_memory = false});
}

TEST(OverlapTest, GradientsThatNeverCameAreSummedAsZeros) {
  std::vector<std::vector<float>> results(3);
  run_ranks(3, [&](int r, Collectives& c) {
    std::vector<Tensor> out = {Tensor(Shape{4}), Tensor(Shape{3})};
    OverlappedGradientReduction overlap(c, out, {}, 16);
    if (r != 2) {  // rank 2 had no rows: its backward never ran
      overlap.gradient_ready(1, Tensor::from_vector<float>({1, 2, 3}, {3}));
      overlap.gradient_ready(0, Tensor());  // no gradient reached variable 0
    }
    overlap.finish();
    results[r] = out[1].to_vector<float>();
    EXPECT_EQ(out[0].to_vector<float>(), std::vector<float>(4, 0.0f));
  });
  for (const auto& v : results) EXPECT_EQ(v, (std::vector<float>{2, 4, 6}));
}

TEST(OverlapTest, RejectsAGradientOfTheWrongSize) {
  run_ranks(1, [&](int, Collectives& c) {
    std::vector<Tensor> out = {Tensor(Shape{4})};
    OverlappedGradientReduction overlap(c, out, {}, 16);
    EXPECT_THROW(overlap.gradient_ready(0, Tensor(Shape{5})), InvalidArgumentError);
    overlap.abandon();
  });
}

}  // namespace
}  // namespace dtrain::distribute
