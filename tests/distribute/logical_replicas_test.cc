// The exact reduction over logical replicas (src/distribute/logical_replicas.h) with workers as
// threads over real Gloo pairs: the sums over 6 logical replicas are bitwise the serial sum in
// logical order for 1, 2, 3, 4 and 6 workers (uneven blocks included), with a replica without
// rows and an undefined gradient; blocks are contiguous; bad counts are refused.
#include "distribute/logical_replicas.h"

#include <gtest/gtest.h>

#include <cstring>

#include "dtrain/core/error.h"
#include "dtrain/core/random.h"
#include "testutil/ranks.h"

namespace dtrain::distribute {
namespace {

constexpr int kLogical = 6;

// Logical replica l's gradients: float32 [5, 7] and float64 [3]; replica 4 has no rows (an
// empty list) and replica 2 no gradient for the second variable.
std::vector<Tensor> gradients_of(int l) {
  if (l == 4) return {};
  Philox rng(100 + l);
  Tensor a(Shape{5, 7});
  for (int64_t i = 0; i < a.num_elements(); ++i) a.data<float>()[i] = rng.normal() * 1e3f;
  Tensor b(DType::kFloat64, Shape{3});
  for (int64_t i = 0; i < 3; ++i) b.data<double>()[i] = rng.normal() * 1e-3;
  if (l == 2) return {a, Tensor()};
  return {a, b};
}

std::vector<Tensor> outputs() { return {Tensor(Shape{5, 7}), Tensor(DType::kFloat64, Shape{3})}; }

// The serial sum in logical order, the first contribution copied.
std::vector<Tensor> serial() {
  std::vector<Tensor> out = outputs();
  for (size_t v = 0; v < out.size(); ++v) {
    bool first = true;
    for (int l = 0; l < kLogical; ++l) {
      const std::vector<Tensor> g = gradients_of(l);
      if (g.empty() || !g[v].defined()) continue;
      if (first) {
        out[v].copy_from(g[v]);
        first = false;
      } else if (out[v].dtype() == DType::kFloat32) {
        for (int64_t i = 0; i < out[v].num_elements(); ++i)
          out[v].data<float>()[i] += g[v].data<float>()[i];
      } else {
        for (int64_t i = 0; i < out[v].num_elements(); ++i)
          out[v].data<double>()[i] += g[v].data<double>()[i];
      }
    }
  }
  return out;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(LogicalReplicasTest, BlocksAreContiguousAndCoverEveryReplicaOnce) {
  EXPECT_EQ(logical_block(6, 4, 0), std::make_pair(0, 2));
  EXPECT_EQ(logical_block(6, 4, 1), std::make_pair(2, 4));
  EXPECT_EQ(logical_block(6, 4, 2), std::make_pair(4, 5));
  EXPECT_EQ(logical_block(6, 4, 3), std::make_pair(5, 6));
  EXPECT_EQ(logical_block(6, 3, 2), std::make_pair(4, 6));
  EXPECT_EQ(logical_block(6, 1, 0), std::make_pair(0, 6));
  EXPECT_THROW(logical_block(0, 1, 0), InvalidArgumentError);
  try {
    logical_block(2, 3, 0);
    ADD_FAILURE() << "3 workers for 2 logical replicas accepted";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("3 workers for 2 logical replicas"), std::string::npos)
        << e.what();
  }
}

TEST(LogicalReplicasTest, SumsAreBitwiseTheSerialSumForAnyNumberOfWorkers) {
  const std::vector<Tensor> want = serial();
  for (int workers : {1, 2, 3, 4, 6}) {
    SCOPED_TRACE(std::to_string(workers) + " workers");
    std::vector<std::vector<Tensor>> got(workers);
    testutil::run_ranks(workers, [&](int rank, Collectives& c) {
      const auto [b, e] = logical_block(kLogical, workers, rank);
      std::vector<std::vector<Tensor>> local;
      for (int l = b; l < e; ++l) local.push_back(gradients_of(l));
      std::vector<Tensor> out = outputs();
      LogicalReplicaReduction reduction(kLogical);
      for (int step = 0; step < 2; ++step) {  // buffers reused
        reduction.gather(workers > 1 ? &c : nullptr, local, out);
        for (int part = 0; part < 3; ++part) reduction.sum(out, part, 3, 1.0);
      }
      got[rank] = out;
    });
    for (int r = 0; r < workers; ++r) {
      for (size_t v = 0; v < want.size(); ++v) {
        EXPECT_TRUE(same_bits(got[r][v], want[v])) << "worker " << r << " variable " << v;
      }
    }
  }
}

TEST(LogicalReplicasTest, RefusesGradientListsThatDoNotFit) {
  LogicalReplicaReduction reduction(kLogical);
  std::vector<Tensor> out = outputs();
  std::vector<std::vector<Tensor>> local(kLogical);
  local[0] = {Tensor(Shape{5, 6}), Tensor(DType::kFloat64, Shape{3})};
  EXPECT_THROW(reduction.gather(nullptr, local, out), InvalidArgumentError);
  local.resize(5);
  EXPECT_THROW(reduction.gather(nullptr, local, out), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain::distribute
