// The recurrent sequence op (LSTM, GRU with and without reset_after, go_backwards) against a
// step-by-step reference built from differentiable primitives, and finite-difference gradients.
#include "dtrain/autograd/recurrent.h"

#include <gtest/gtest.h>

#include "dtrain/autograd/functions.h"
#include "testutil/gradcheck.h"

namespace dtrain {
namespace {

using ops::RecurrentCell;
using ops::RecurrentSpec;
using testutil::gradcheck;
using testutil::random_tensor;
using Inputs = std::vector<Tensor>;
constexpr double kTol = 2e-2;

// Columns [k·u, (k+1)·u) of m [rows, G·u] (a reference helper: rows × u copy).
Tensor block(const Tensor& m, int64_t k, int64_t u) {
  const int64_t rows = m.dim(0), cols = m.dim(1);
  Tensor out(Shape{rows, u});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < u; ++j)
      out.data<float>()[r * u + j] = m.data<float>()[r * cols + k * u + j];
  return out;
}
Tensor row(const Tensor& v, int64_t k, int64_t u) {  // v [G·u] → block k as [u]
  return Tensor::from_vector(
      std::vector<float>(v.data<float>() + k * u, v.data<float>() + (k + 1) * u), Shape{u});
}

// h_T by explicit per-step formulas (Keras's cells), no autograd needed.
Tensor reference_last(const RecurrentSpec& spec, const Tensor& x, const Tensor& W, const Tensor& U,
                      const Tensor& b) {
  NoGradGuard no_grad;
  const int64_t B = x.dim(0), T = x.dim(1), F = x.dim(2), u = U.dim(0);
  Tensor h = Tensor::zeros(Shape{B, u}), c = Tensor::zeros(Shape{B, u});
  for (int64_t s = 0; s < T; ++s) {
    const int64_t tau = spec.go_backwards ? T - 1 - s : s;
    Tensor xt(Shape{B, F});
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t f = 0; f < F; ++f)
        xt.data<float>()[bb * F + f] = x.data<float>()[(bb * T + tau) * F + f];
    auto lin = [&](int64_t k) { return matmul(xt, block(W, k, u)); };
    if (spec.cell == RecurrentCell::kLstm) {
      auto z = [&](int64_t k) {
        return lin(k) + matmul(h, block(U, k, u)) + row(b, k, 4 * u == b.dim(0) ? u : u);
      };
      const Tensor i = sigmoid(z(0)), f = sigmoid(z(1)), g = tanh(z(2)), o = sigmoid(z(3));
      c = f * c + i * g;
      h = o * tanh(c);
    } else if (spec.cell == RecurrentCell::kGru) {
      const Tensor bi = b[0], br = b[1];
      auto rec = [&](int64_t k) { return matmul(h, block(U, k, u)) + row(br, k, u); };
      const Tensor z = sigmoid(lin(0) + row(bi, 0, u) + rec(0));
      const Tensor r = sigmoid(lin(1) + row(bi, 1, u) + rec(1));
      const Tensor hh = tanh(lin(2) + row(bi, 2, u) + r * rec(2));
      h = z * h + (1.0f - z) * hh;
    } else {
      const Tensor z = sigmoid(lin(0) + matmul(h, block(U, 0, u)) + row(b, 0, u));
      const Tensor r = sigmoid(lin(1) + matmul(h, block(U, 1, u)) + row(b, 1, u));
      const Tensor hh = tanh(lin(2) + matmul(r * h, block(U, 2, u)) + row(b, 2, u));
      h = z * h + (1.0f - z) * hh;
    }
  }
  return h;
}

struct Case {
  RecurrentCell cell;
  bool go_backwards;
};

class RecurrentOp : public ::testing::TestWithParam<Case> {};

TEST_P(RecurrentOp, MatchesTheStepFormulasAndItsGradients) {
  const RecurrentSpec spec{.cell = GetParam().cell, .go_backwards = GetParam().go_backwards};
  const int64_t B = 2, T = 4, F = 3, u = 3;
  const int64_t G = spec.cell == RecurrentCell::kLstm ? 4 : 3;
  const Tensor x = random_tensor(Shape{B, T, F}, 1);
  const Tensor W = random_tensor(Shape{F, G * u}, 2);
  const Tensor U = random_tensor(Shape{u, G * u}, 3);
  const Tensor b =
      random_tensor(spec.cell == RecurrentCell::kGru ? Shape{2, G * u} : Shape{G * u}, 4);
  const Tensor states = recurrent_sequence(spec, x, W, U, b, "test");
  const Tensor expected = reference_last(spec, x, W, U, b);
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t j = 0; j < u; ++j) {
      const int64_t sw = states.dim(2);
      EXPECT_NEAR(states.data<float>()[(bb * T + T - 1) * sw + j],
                  expected.data<float>()[bb * u + j], 1e-5);
    }
  // Every state (h and, for LSTM, c) of every step feeds the loss.
  EXPECT_LT(
      gradcheck(
          [&](const Inputs& v) { return recurrent_sequence(spec, v[0], v[1], v[2], v[3], "t"); },
          {x, W, U, b}),
      kTol);
  // Only the last h, through slice_sequence; no bias.
  EXPECT_LT(gradcheck(
                [&](const Inputs& v) {
                  return slice_sequence(recurrent_sequence(spec, v[0], v[1], v[2], Tensor(), "t"),
                                        T - 1, T, 0, u);
                },
                {x, W, U}),
            kTol);
}

INSTANTIATE_TEST_SUITE_P(Cells, RecurrentOp,
                         ::testing::Values(Case{RecurrentCell::kLstm, false},
                                           Case{RecurrentCell::kLstm, true},
                                           Case{RecurrentCell::kGru, false},
                                           Case{RecurrentCell::kGru, true},
                                           Case{RecurrentCell::kGruResetBefore, false},
                                           Case{RecurrentCell::kGruResetBefore, true}));

TEST(SequenceSlicing, SliceAndReverseGradients) {
  const Tensor x = random_tensor(Shape{2, 5, 4}, 9);
  EXPECT_LT(gradcheck([](const Inputs& v) { return slice_sequence(v[0], 1, 4, 2, 4); }, {x}), kTol);
  EXPECT_LT(gradcheck([](const Inputs& v) { return reverse_sequence(v[0]); }, {x}), kTol);
  const Tensor r = reverse_sequence(x);
  EXPECT_EQ(r.data<float>()[(0 * 5 + 4) * 4 + 1], x.data<float>()[(0 * 5 + 0) * 4 + 1]);
  EXPECT_THROW(slice_sequence(x, 0, 6, 0, 4), InvalidArgumentError);
}

}  // namespace
}  // namespace dtrain
