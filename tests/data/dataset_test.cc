#include "dtrain/data/dataset.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/random.h"

namespace dtrain::data {
namespace {

// Elements 0, 1, ..., n-1 as int64 scalars.
Dataset range(int64_t n) {
  std::vector<int64_t> v(n);
  std::iota(v.begin(), v.end(), 0);
  return Dataset::from_tensor_slices({Tensor::from_vector<int64_t>(v, Shape{n})});
}

// Runs one pass and returns the first component's values, flattened (batches concatenated).
std::vector<int64_t> values(const Dataset& ds, int64_t iteration = 0) {
  std::vector<int64_t> out;
  Iterator it = ds.iterator(iteration);
  Element e;
  while (it.next(e)) {
    const int64_t* p = e[0].data<int64_t>();
    out.insert(out.end(), p, p + e[0].num_elements());
  }
  return out;
}

// Runs one pass and returns the first dimension of every element's first component.
std::vector<int64_t> batch_sizes(const Dataset& ds) {
  std::vector<int64_t> out;
  Iterator it = ds.iterator();
  Element e;
  while (it.next(e)) out.push_back(e[0].dim(0));
  return out;
}

// Number of elements in one pass.
int64_t count(const Dataset& ds) {
  Iterator it = ds.iterator();
  Element e;
  int64_t n = 0;
  while (it.next(e)) ++n;
  return n;
}

std::vector<int64_t> iota(int64_t begin, int64_t end) {
  std::vector<int64_t> v(end - begin);
  std::iota(v.begin(), v.end(), begin);
  return v;
}

bool is_permutation_of_range(std::vector<int64_t> v, int64_t n) {
  std::sort(v.begin(), v.end());
  return v == iota(0, n);
}

TEST(Dataset, FromTensorSlicesYieldsZeroCopyRows) {
  Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, Shape{3, 2});
  Tensor y = Tensor::from_vector<int64_t>({7, 8, 9}, Shape{3});
  Dataset ds = Dataset::from_tensor_slices({x, y});
  EXPECT_EQ(ds.cardinality(), 3);
  Iterator it = ds.iterator();
  Element e;
  for (int64_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(it.next(e));
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e[0].shape(), (Shape{2}));
    EXPECT_EQ(e[1].shape(), Shape{});
    EXPECT_TRUE(e[0].shares_buffer_with(x));
    EXPECT_EQ(e[0].to_vector<float>(), (std::vector<float>{2.0f * i + 1, 2.0f * i + 2}));
    EXPECT_EQ(e[1].item(), 7 + i);
    EXPECT_EQ(it.state(), (IteratorState{0, i + 1}));
  }
  EXPECT_FALSE(it.next(e));
  EXPECT_FALSE(it.next(e));
}

TEST(Dataset, FromTensorSlicesRejectsMismatchedFirstDimensions) {
  try {
    Dataset::from_tensor_slices({Tensor::zeros({3, 2}), Tensor::zeros({4})});
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[3, 2]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  }
  EXPECT_THROW(Dataset::from_tensor_slices({}), InvalidArgumentError);
  EXPECT_THROW(Dataset::from_tensor_slices({Tensor::scalar(1)}), InvalidArgumentError);
}

TEST(Dataset, UndefinedDatasetThrowsFailedPrecondition) {
  Dataset ds;
  EXPECT_FALSE(ds.defined());
  EXPECT_THROW(ds.batch(2), FailedPreconditionError);
  EXPECT_THROW(ds.iterator(), FailedPreconditionError);
}

TEST(Dataset, MapTransformsEveryElement) {
  Dataset ds = range(5).map([](Element e) {
    Tensor t(DType::kInt64, Shape{});
    *t.data<int64_t>() = *e[0].data<int64_t>() * 10;
    e.push_back(t);
    return e;
  });
  Iterator it = ds.iterator();
  Element e;
  for (int64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(it.next(e));
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e[0].item(), i);
    EXPECT_EQ(e[1].item(), 10 * i);
  }
  EXPECT_FALSE(it.next(e));
  EXPECT_EQ(ds.cardinality(), 5);
}

TEST(Dataset, ShuffleIsAReproduciblePermutationThatChangesPerIteration) {
  Dataset ds = range(100).shuffle(30, 1234);
  const std::vector<int64_t> a0 = values(ds, 0);
  const std::vector<int64_t> a1 = values(ds, 1);
  EXPECT_TRUE(is_permutation_of_range(a0, 100));
  EXPECT_TRUE(is_permutation_of_range(a1, 100));
  EXPECT_NE(a0, iota(0, 100));
  EXPECT_NE(a0, a1);
  EXPECT_EQ(values(ds, 0), a0);                            // same pass, same order
  EXPECT_EQ(values(range(100).shuffle(30, 1234), 1), a1);  // same seed, same order
  EXPECT_NE(values(range(100).shuffle(30, 99), 0), a0);    // other seed, other order
  EXPECT_EQ(ds.cardinality(), 100);
}

TEST(Dataset, ShuffleWithoutReshuffleRepeatsTheOrder) {
  Dataset ds = range(50).shuffle(50, 7, /*reshuffle_each_iteration=*/false);
  EXPECT_EQ(values(ds, 0), values(ds, 3));
  EXPECT_NE(values(ds, 0), iota(0, 50));
}

TEST(Dataset, ShuffleBufferBoundsDisplacement) {
  // With a buffer of k, element i cannot come out before position i - k + 1.
  const std::vector<int64_t> v = values(range(200).shuffle(5, 3));
  for (size_t pos = 0; pos < v.size(); ++pos) EXPECT_LE(v[pos], static_cast<int64_t>(pos) + 4);
  EXPECT_EQ(values(range(20).shuffle(1, 3)), iota(0, 20));  // buffer 1: no shuffling
}

TEST(Dataset, ShuffleSeedFromGlobalSeedIsReproducible) {
  set_random_seed(42);
  const std::vector<int64_t> a = values(range(64).shuffle(64));
  set_random_seed(42);
  const std::vector<int64_t> b = values(range(64).shuffle(64));
  EXPECT_EQ(a, b);
  EXPECT_TRUE(is_permutation_of_range(a, 64));
}

TEST(Dataset, BatchStacksComponentsIntoFreshTensors) {
  Tensor x(DType::kFloat32, Shape{10, 2});
  for (int i = 0; i < 20; ++i) x.data<float>()[i] = static_cast<float>(i);
  Tensor y = Tensor::from_vector<int64_t>(iota(0, 10), Shape{10});
  Dataset ds = Dataset::from_tensor_slices({x, y}).batch(4);
  EXPECT_EQ(ds.cardinality(), 3);
  Iterator it = ds.iterator();
  Element e;
  ASSERT_TRUE(it.next(e));
  EXPECT_EQ(e[0].shape(), (Shape{4, 2}));
  EXPECT_EQ(e[1].shape(), (Shape{4}));
  EXPECT_FALSE(e[0].shares_buffer_with(x));
  EXPECT_EQ(e[0].to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(e[1].to_vector<int64_t>(), iota(0, 4));
  ASSERT_TRUE(it.next(e));
  ASSERT_TRUE(it.next(e));
  EXPECT_EQ(e[0].shape(), (Shape{2, 2}));
  EXPECT_EQ(e[0].to_vector<float>(), (std::vector<float>{16, 17, 18, 19}));
  EXPECT_EQ(e[1].to_vector<int64_t>(), iota(8, 10));
  EXPECT_FALSE(it.next(e));

  EXPECT_EQ(batch_sizes(range(10).batch(4)), (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(batch_sizes(range(10).batch(4, /*drop_remainder=*/true)), (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(values(range(10).batch(4, true)), iota(0, 8));
  EXPECT_EQ(range(10).batch(4, true).cardinality(), 2);
  EXPECT_EQ(range(8).batch(4, false).cardinality(), 2);
}

TEST(Dataset, BatchRejectsElementsOfDifferentShapes) {
  Dataset ds = range(4)
                   .map([](Element e) {
                     const int64_t n = *e[0].data<int64_t>() + 1;
                     return Element{Tensor::zeros(Shape{n})};
                   })
                   .batch(2);
  Iterator it = ds.iterator();
  Element e;
  try {
    it.next(e);
    FAIL() << "expected InvalidArgumentError";
  } catch (const InvalidArgumentError& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("component 0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[2]"), std::string::npos) << msg;
  }
  // The error is sticky.
  EXPECT_THROW(it.next(e), InvalidArgumentError);
}

TEST(Dataset, RepeatTakeSkipShardYieldExactSequences) {
  EXPECT_EQ(values(range(3).repeat(2)), (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(values(range(3).repeat(0)), std::vector<int64_t>{});
  EXPECT_EQ(values(range(3).repeat().take(7)), (std::vector<int64_t>{0, 1, 2, 0, 1, 2, 0}));
  EXPECT_EQ(values(range(0).repeat()), std::vector<int64_t>{});  // ends instead of spinning
  EXPECT_EQ(values(range(10).take(3)), iota(0, 3));
  EXPECT_EQ(values(range(10).take(30)), iota(0, 10));
  EXPECT_EQ(values(range(10).take(-1)), iota(0, 10));
  EXPECT_EQ(values(range(10).skip(7)), iota(7, 10));
  EXPECT_EQ(values(range(10).skip(30)), std::vector<int64_t>{});
  EXPECT_EQ(values(range(10).skip(-1)), std::vector<int64_t>{});
  EXPECT_EQ(values(range(10).shard(3, 0)), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(values(range(10).shard(3, 1)), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(values(range(10).shard(3, 2)), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(values(range(2).shard(3, 2)), std::vector<int64_t>{});
  EXPECT_EQ(values(range(10).skip(2).take(5).shard(2, 1)), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(values(range(5).repeat(2).batch(3)),
            (std::vector<int64_t>{0, 1, 2, 3, 4, 0, 1, 2, 3, 4}));
  EXPECT_EQ(batch_sizes(range(5).repeat(2).batch(3)), (std::vector<int64_t>{3, 3, 3, 1}));
  EXPECT_THROW(range(10).shard(3, 3), InvalidArgumentError);
  EXPECT_THROW(range(10).batch(0), InvalidArgumentError);
  EXPECT_THROW(range(10).shuffle(0), InvalidArgumentError);
}

TEST(Dataset, RepeatReshufflesEachRepetitionLikeLaterPasses) {
  Dataset shuffled = range(20).shuffle(20, 5);
  const std::vector<int64_t> v = values(shuffled.repeat(3), 0);
  ASSERT_EQ(v.size(), 60u);
  // Repetition r of pass i is pass i * count + r of the input.
  EXPECT_EQ(std::vector<int64_t>(v.begin(), v.begin() + 20), values(shuffled, 0));
  EXPECT_EQ(std::vector<int64_t>(v.begin() + 20, v.begin() + 40), values(shuffled, 1));
  EXPECT_EQ(std::vector<int64_t>(v.begin() + 40, v.end()), values(shuffled, 2));
  EXPECT_EQ(std::vector<int64_t>(values(shuffled.repeat(3), 1)).size(), 60u);
  EXPECT_EQ(std::vector<int64_t>(values(shuffled.repeat(3), 1)).front(), values(shuffled, 3)[0]);
}

TEST(Dataset, CardinalityFollowsTensorFlow) {
  EXPECT_EQ(range(10).shuffle(4, 1).batch(3).cardinality(), 4);
  EXPECT_EQ(range(10).shuffle(4, 1).batch(3, true).cardinality(), 3);
  EXPECT_EQ(range(10).repeat().cardinality(), kInfiniteCardinality);
  EXPECT_EQ(range(10).repeat().take(25).cardinality(), 25);
  EXPECT_EQ(range(10).repeat().batch(3).cardinality(), kInfiniteCardinality);
  EXPECT_EQ(range(10).repeat().skip(3).cardinality(), kInfiniteCardinality);
  EXPECT_EQ(range(0).repeat().cardinality(), 0);
  EXPECT_EQ(range(10).repeat(3).cardinality(), 30);
  EXPECT_EQ(range(10).take(4).cardinality(), 4);
  EXPECT_EQ(range(10).skip(4).cardinality(), 6);
  EXPECT_EQ(range(10).skip(40).cardinality(), 0);
  EXPECT_EQ(range(10).shard(3, 0).cardinality(), 4);
  EXPECT_EQ(range(10).shard(3, 2).cardinality(), 3);
  EXPECT_EQ(range(10).map([](Element e) { return e; }).prefetch(2).cardinality(), 10);
  // Check the computed values against the actual counts.
  for (const Dataset& ds :
       {range(10).shard(3, 1), range(10).skip(3).batch(4), range(7).repeat(2).batch(4, true)}) {
    EXPECT_EQ(static_cast<int64_t>(count(ds)), ds.cardinality());
  }
}

TEST(Dataset, PrefetchYieldsTheSameElements) {
  Dataset base = range(100).shuffle(16, 9).batch(7).repeat(2);
  EXPECT_EQ(values(base.prefetch(3)), values(base));
  EXPECT_EQ(values(base.prefetch(kAutotune), 1), values(base, 1));
  EXPECT_EQ(values(base.prefetch(1).prefetch(5)), values(base));
  EXPECT_EQ(values(range(0).prefetch(2)), std::vector<int64_t>{});
  EXPECT_THROW(base.prefetch(0), InvalidArgumentError);
}

TEST(Dataset, PrefetchShutsDownWhenAbandonedMidPass) {
  std::atomic<int64_t> produced{0};
  {
    Dataset ds = range(10)
                     .repeat()
                     .map([&produced](Element e) {
                       ++produced;
                       return e;
                     })
                     .prefetch(4);
    Iterator it = ds.iterator();
    Element e;
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(it.next(e));
    EXPECT_EQ(e[0].item(), 2);
  }  // destroying the iterator stops and joins the producer of an infinite pipeline
  const int64_t after = produced.load();
  // The producer runs at most buffer_size (+1 in flight) ahead of the consumer.
  EXPECT_LE(after, 3 + 4 + 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(produced.load(), after);
}

TEST(Dataset, PrefetchRethrowsProducerExceptionsAfterEarlierElements) {
  Dataset ds = range(10)
                   .map([](Element e) {
                     if (*e[0].data<int64_t>() == 5) throw DataLossError("bad record 5");
                     return e;
                   })
                   .prefetch(3);
  Iterator it = ds.iterator();
  Element e;
  for (int64_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(it.next(e));
    EXPECT_EQ(e[0].item(), i);
  }
  try {
    it.next(e);
    FAIL() << "expected DataLossError";
  } catch (const DataLossError& err) {
    EXPECT_STREQ(err.what(), "bad record 5");
  }
  EXPECT_THROW(it.next(e), DataLossError);
  EXPECT_EQ(it.state().position, 5);
}

// Collects every remaining element of `it` (deep copies).
std::vector<Element> drain(Iterator& it) {
  std::vector<Element> out;
  Element e;
  while (it.next(e)) {
    Element copy;
    for (const Tensor& t : e) copy.push_back(t.clone());
    out.push_back(std::move(copy));
  }
  return out;
}

void expect_bitwise_equal(const std::vector<Element>& a, const std::vector<Element>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].size(), b[i].size());
    for (size_t c = 0; c < a[i].size(); ++c) {
      EXPECT_TRUE(a[i][c].equals(b[i][c])) << "element " << i << " component " << c;
    }
  }
}

class ResumeTest : public ::testing::TestWithParam<bool> {};

TEST_P(ResumeTest, IteratorFromResumesBitwise) {
  const bool prefetch = GetParam();
  Philox rng(3);
  Tensor x(DType::kFloat32, Shape{101, 3});
  for (int64_t i = 0; i < x.num_elements(); ++i) x.data<float>()[i] = rng.normal();
  Tensor y = Tensor::from_vector<int64_t>(iota(0, 101), Shape{101});
  Dataset ds = Dataset::from_tensor_slices({x, y}).shuffle(32, 77).batch(8).repeat(3);
  if (prefetch) ds = ds.prefetch(2);
  ASSERT_EQ(ds.cardinality(), 39);

  for (int64_t iteration : {0, 2}) {
    Iterator full = ds.iterator(iteration);
    const std::vector<Element> all = drain(full);
    ASSERT_EQ(all.size(), 39u);
    for (int64_t position : {0, 1, 12, 13, 25, 38, 39}) {
      // Resume from a state reached by a live iterator...
      Iterator live = ds.iterator(iteration);
      Element e;
      for (int64_t i = 0; i < position; ++i) ASSERT_TRUE(live.next(e));
      const IteratorState state = live.state();
      EXPECT_EQ(state, (IteratorState{iteration, position}));
      Iterator resumed = ds.iterator_from(state);
      EXPECT_EQ(resumed.state(), state);
      const std::vector<Element> rest(all.begin() + position, all.end());
      expect_bitwise_equal(drain(resumed), rest);
      // ...and the live iterator continues identically.
      expect_bitwise_equal(drain(live), rest);
    }
  }
  EXPECT_THROW(ds.iterator_from({0, 40}), InvalidArgumentError);
}

INSTANTIATE_TEST_SUITE_P(Dataset, ResumeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Prefetch" : "Plain"; });

TEST(Dataset, IteratorFromSkipsWithoutCallingMapFunctions) {
  std::atomic<int> calls{0};
  Dataset ds = range(10).map([&calls](Element e) {
    ++calls;
    return e;
  });
  Iterator it = ds.iterator_from({0, 6});
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(values(ds.skip(6)), iota(6, 10));
  calls = 0;
  Element e;
  ASSERT_TRUE(it.next(e));
  EXPECT_EQ(e[0].item(), 6);
  EXPECT_EQ(calls.load(), 1);
}

TEST(Dataset, IteratorFromThroughShardTakeSkipMatches) {
  Dataset ds = range(50).shuffle(8, 1).skip(3).shard(3, 1).repeat(2).take(25).batch(2);
  Iterator full = ds.iterator(4);
  const std::vector<Element> all = drain(full);
  for (int64_t p = 0; p <= static_cast<int64_t>(all.size()); ++p) {
    Iterator resumed = ds.iterator_from({4, p});
    expect_bitwise_equal(drain(resumed), std::vector<Element>(all.begin() + p, all.end()));
  }
}

}  // namespace
}  // namespace dtrain::data

namespace dtrain::data {
namespace {

// from_tensor_slices → shuffle → batch gathers rows by index (no per-element views); a map in
// between forces the element-by-element path. Both must give the same order, batches, and
// resumed sequences.
TEST(Dataset, RowIndexFastPathMatchesTheElementPath) {
  const auto identity = [](Element e) { return e; };
  for (int64_t buffer : {1, 7, 100, 1000}) {
    const Dataset fast = range(300).shuffle(buffer, 5).batch(32);
    const Dataset slow = range(300).map(identity).shuffle(buffer, 5).batch(32);
    for (int64_t iteration : {0, 3}) {
      EXPECT_EQ(values(fast, iteration), values(slow, iteration)) << "buffer " << buffer;
    }
    EXPECT_EQ(batch_sizes(fast), batch_sizes(slow));
    // Resuming mid-pass goes through skip() in both paths.
    Iterator a = fast.iterator_from({2, 4});
    Iterator b = slow.iterator_from({2, 4});
    Element ea, eb;
    while (a.next(ea)) {
      ASSERT_TRUE(b.next(eb));
      EXPECT_TRUE(ea[0].equals(eb[0]));
    }
    EXPECT_FALSE(b.next(eb));
  }
  // Two components, one of rank 2: rows keep their shape and pairing.
  std::vector<float> xs(300 * 3);
  std::iota(xs.begin(), xs.end(), 0.0f);
  std::vector<int64_t> ys(300);
  std::iota(ys.begin(), ys.end(), 0);
  const Dataset pairs = Dataset::from_tensor_slices({Tensor::from_vector<float>(xs, Shape{300, 3}),
                                                     Tensor::from_vector<int64_t>(ys, Shape{300})})
                            .shuffle(50, 9)
                            .batch(16);
  Iterator it = pairs.iterator();
  Element e;
  while (it.next(e)) {
    for (int64_t r = 0; r < e[1].dim(0); ++r) {
      const int64_t y = e[1].data<int64_t>()[r];
      EXPECT_EQ(e[0].data<float>()[r * 3], static_cast<float>(y * 3));
    }
  }
}

}  // namespace
}  // namespace dtrain::data
