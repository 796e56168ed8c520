// ShardedOptimizerUpdate (ZeRO stages 1 and 2) with ranks as threads on loopback: after every
// step the variables are bitwise those of one all-reduce and Adam on every row, also after a
// variable's storage is replaced between steps; the slots, gathered at the end, are bitwise the
// unsharded optimizer's; each rank's slots and (stage 2) summed gradients are its partition_rows
// share. With clipping by norm (clipnorm, global_clipnorm) too. Over shared memory (the
// all-gather lands straight in the variables) and over Gloo's pairs.
#include "dtrain/distribute/sharded_update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "dtrain/core/error.h"
#include "dtrain/optim/adam.h"
#include "testutil/ranks.h"

namespace dtrain::distribute {
namespace {

// Small buckets, so that the reductions span several; over shared memory (the default with ranks
// as threads) or Gloo's pairs.
void run_ranks(int size, const std::function<void(int, Collectives&)>& fn,
               bool shared_memory = true) {
  testutil::run_ranks(size, fn, {.bucket_bytes = 4096, .shared_memory = shared_memory});
}

Tensor values(const Shape& shape, int rank, int salt) {
  Tensor t(shape);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const double u = std::sin(1e-3 * static_cast<double>(i * 7919 + rank * 104729 + salt * 31));
    p[i] = static_cast<float>(u * std::ldexp(1.0, static_cast<int>((i + rank) % 25) - 12));
  }
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// Clipping: 0 none, 1 clipnorm, 2 global_clipnorm (both scale these gradients down).
optim::AdamOptions adam_options(int clipping) {
  return {.learning_rate = 0.01,
          .clipnorm = clipping == 1 ? 0.5 : 0.0,
          .global_clipnorm = clipping == 2 ? 1.0 : 0.0};
}

// (workers, stage, clipping, shared memory)
class ShardedUpdateTest : public ::testing::TestWithParam<std::tuple<int, int, int, bool>> {};

TEST_P(ShardedUpdateTest, MatchesTheUnshardedUpdateBitwise) {
  const auto [workers, stage, clipping, shared_memory] = GetParam();
  const std::vector<Shape> shapes = {{7, 5}, {5}, {300, 40}, {}, {2, 3, 4}};
  run_ranks(
      workers,
      [&](int r, Collectives& c) {
        std::vector<std::unique_ptr<Variable>> ref_vars, vars;
        std::vector<Variable*> ref_ptrs, ptrs;
        for (size_t k = 0; k < shapes.size(); ++k) {
          const std::string name = "v" + std::to_string(k);
          ref_vars.push_back(std::make_unique<Variable>(name, values(shapes[k], 9, k)));
          vars.push_back(std::make_unique<Variable>(name, values(shapes[k], 9, k)));
          ref_ptrs.push_back(ref_vars.back().get());
          ptrs.push_back(vars.back().get());
        }
        optim::Adam ref_opt(adam_options(clipping));
        optim::Adam opt(adam_options(clipping));
        Tensor flags = Tensor::from_vector<float>({0, 1}, {2});
        std::vector<Tensor> extra = {flags};
        ShardedOptimizerUpdate sharded(c, ptrs, extra, stage, opt);
        for (int step = 0; step < 3; ++step) {
          std::vector<Tensor> grads, reference;
          for (size_t k = 0; k < shapes.size(); ++k) {
            grads.push_back(values(shapes[k], r, 10 * step + static_cast<int>(k)));
            reference.push_back(grads.back().clone());
          }
          flags.data<float>()[1] = 1;
          reference.push_back(flags.clone());
          if (step == 1) {
            // A restore may give a variable new storage (same values): the shard must follow.
            for (auto& v : vars) v->tensor() = v->tensor().clone();
          }
          c.all_reduce(reference, ReduceOp::kSum);
          ref_opt.apply_gradients(std::span<const Tensor>(reference.data(), shapes.size()),
                                  ref_ptrs);
          sharded.reduce(grads);
          EXPECT_EQ(flags.data<float>()[1], static_cast<float>(workers));
          EXPECT_TRUE(sharded.all_finite());
          sharded.apply();
          for (size_t k = 0; k < shapes.size(); ++k) {
            ASSERT_TRUE(same_bits(vars[k]->tensor(), ref_vars[k]->tensor()))
                << "rank " << r << " variable " << k << " step " << step;
          }
        }
        // Each rank's share of the slots; together they are the unsharded slots once.
        const size_t full = 2 * 4 * sharded.partition().total_elements;
        const size_t mine = sharded.slot_bytes();
        EXPECT_EQ(mine, 2 * 4 * static_cast<size_t>(sharded.partition().shard_elements(r)));
        EXPECT_LE(mine, full / workers + 2 * 4 * 40);
        if (stage == 2) {
          EXPECT_EQ(sharded.gradient_bytes(), mine / 2);
        } else {
          EXPECT_EQ(sharded.gradient_bytes(), full / 2);
        }
        sharded.gather_slots();
        for (size_t k = 0; k < shapes.size(); ++k) {
          for (const char* slot : {"m", "v"}) {
            const Variable* a = opt.slot(*vars[k], slot);
            const Variable* b = ref_opt.slot(*ref_vars[k], slot);
            ASSERT_TRUE(a != nullptr && b != nullptr);
            ASSERT_TRUE(same_bits(a->tensor(), b->tensor())) << "slot " << slot << " of " << k;
          }
        }
        EXPECT_EQ(opt.variables().size(), ref_opt.variables().size());
        EXPECT_EQ(opt.iterations(), 3);
      },
      shared_memory);
}

INSTANTIATE_TEST_SUITE_P(WorkersStagesAndClipping, ShardedUpdateTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values(1, 2),
                                            ::testing::Values(0, 1, 2), ::testing::Bool()));

TEST(ShardedUpdateTest, RefusesUnknownStages) {
  run_ranks(1, [&](int, Collectives& c) {
    Variable v("v", Tensor(Shape{3}));
    std::vector<Variable*> vars = {&v};
    optim::Adam adam(optim::AdamOptions{});
    EXPECT_THROW(ShardedOptimizerUpdate(c, vars, {}, 3, adam), InvalidArgumentError);
  });
}

}  // namespace
}  // namespace dtrain::distribute
