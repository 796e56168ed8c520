// Keras masking: Embedding(mask_zero=true) makes a [batch, time] mask that Sequential and
// Functional carry to the layers that use it (MultiHeadAttention, LSTM/GRU, Bidirectional,
// GlobalAveragePooling1D) through the ones that pass it on (Dense, Dropout, LayerNormalization,
// TimeDistributed, merging layers). The goldens are hand-computed equivalences: a right-padded
// sequence under its mask gives what the unpadded sequence gives; masked LSTM/GRU values and
// gradients are also compared with PyTorch (tools/golden/gen_mask_golden.py, cross-checked there
// against torch.nn.LSTM/GRU on packed sequences).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/autograd/recurrent.h"
#include "dtrain/nn/attention.h"
#include "dtrain/nn/embedding.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/merging.h"
#include "dtrain/nn/model.h"
#include "dtrain/nn/normalization.h"
#include "dtrain/nn/output_mask.h"
#include "dtrain/nn/pooling.h"
#include "dtrain/nn/recurrent.h"
#include "testutil/expect_throws.h"
#include "testutil/golden.h"
#include "testutil/gradcheck.h"
#include "testutil/weights_gradcheck.h"

namespace dtrain::nn {
namespace {

using testutil::expect_throws_with;
using testutil::gradcheck;
using testutil::random_tensor;
using testutil::weights_gradcheck;
constexpr double kTol = 2e-2;

// Rows b of x [B, T, ...] limited to the first `len` steps: [1, len, ...].
Tensor prefix(const Tensor& x, int64_t b, int64_t len) {
  const int64_t T = x.dim(1), row = x.num_elements() / (x.dim(0) * T);
  Shape s = x.shape();
  s[0] = 1;
  s[1] = len;
  Tensor out(s);
  std::copy_n(x.data<float>() + b * T * row, len * row, out.data<float>());
  return out;
}

// A [B, T] mask of 1s for the first lens[b] steps.
Tensor length_mask(const std::vector<int64_t>& lens, int64_t T) {
  Tensor m = Tensor::zeros(Shape{static_cast<int64_t>(lens.size()), T});
  for (size_t b = 0; b < lens.size(); ++b) {
    for (int64_t t = 0; t < lens[b]; ++t) m.data<float>()[b * T + t] = 1.0f;
  }
  return m;
}

void expect_near_all(const Tensor& a, const float* b, int64_t n, float tol, const char* what) {
  ASSERT_GE(a.num_elements(), n) << what;
  for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(a.data<float>()[i], b[i], tol) << what << " " << i;
}

TEST(Masking, EmbeddingMaskZeroMakesTheMask) {
  Embedding emb(10, 3, {.mask_zero = true, .name = "tok"});
  const Tensor ids = Tensor::from_vector<int32_t>({3, 1, 0, 0, 2, 0, 0, 0}, Shape{2, 4});
  const Tensor m = emb.compute_mask(ids, Tensor());
  ASSERT_EQ(m.shape(), (Shape{2, 4}));
  const std::vector<float> want = {1, 1, 0, 0, 1, 0, 0, 0};
  for (int i = 0; i < 8; ++i) EXPECT_EQ(m.data<float>()[i], want[i]);
  Embedding plain(10, 3);
  EXPECT_FALSE(plain.compute_mask(ids, Tensor()).defined());
  // Layers that keep the time axis pass it on; others drop it.
  EXPECT_TRUE(Dense(4).compute_mask(Tensor(), m).defined());
  EXPECT_TRUE(Dropout(0.5f).compute_mask(Tensor(), m).defined());
  EXPECT_TRUE(LayerNormalization().compute_mask(Tensor(), m).defined());
  EXPECT_FALSE(Flatten().compute_mask(Tensor(), m).defined());
  EXPECT_FALSE(LSTM(2).compute_mask(Tensor(), m).defined());
  EXPECT_TRUE(LSTM(2, {.return_sequences = true}).compute_mask(Tensor(), m).defined());
  EXPECT_FALSE(GlobalAveragePooling1D().compute_mask(Tensor(), m).defined());
}

// Each cell: a masked, right-padded batch gives each row's unpadded result: the final state,
// and in return_sequences the padded steps repeat the last real output (Keras's masked rnn).
TEST(Masking, RecurrentMaskedStepsKeepThePreviousState) {
  const Tensor x = random_tensor(Shape{3, 5, 2}, 7);
  const std::vector<int64_t> lens = {5, 3, 1};
  const Tensor mask = length_mask(lens, 5);
  for (int kind = 0; kind < 3; ++kind) {
    SCOPED_TRACE(kind);
    RecurrentOptions o{.return_sequences = true, .reset_after = kind != 2, .seed = 11};
    std::shared_ptr<RecurrentLayer> l;
    if (kind == 0) {
      l = std::make_shared<LSTM>(4, o);
    } else {
      l = std::make_shared<GRU>(4, o);
    }
    const std::vector<Tensor> masked = l->call_with_states(x, mask);
    for (int64_t b = 0; b < 3; ++b) {
      const std::vector<Tensor> ref = l->call_with_states(prefix(x, b, lens[b]));
      // The real steps match, the padded ones repeat the last real output.
      for (int64_t t = 0; t < 5; ++t) {
        const int64_t src = std::min(t, lens[b] - 1);
        for (int64_t j = 0; j < 4; ++j) {
          EXPECT_NEAR(masked[0].data<float>()[(b * 5 + t) * 4 + j],
                      ref[0].data<float>()[src * 4 + j], 1e-6)
              << "b " << b << " t " << t;
        }
      }
      for (size_t k = 1; k < masked.size(); ++k) {
        for (int64_t j = 0; j < 4; ++j) {
          EXPECT_NEAR(masked[k].data<float>()[b * 4 + j], ref[k].data<float>()[j], 1e-6);
        }
      }
    }
    // go_backwards: the padded steps come first and are skipped.
    RecurrentOptions ob = o;
    ob.go_backwards = true;
    ob.return_sequences = false;
    std::shared_ptr<RecurrentLayer> back;
    if (kind == 0) {
      back = std::make_shared<LSTM>(4, ob);
    } else {
      back = std::make_shared<GRU>(4, ob);
    }
    const Tensor yb = back->call_masked(x, mask, false);
    for (int64_t b = 0; b < 3; ++b) {
      const Tensor ref = back->call(prefix(x, b, lens[b]), false);
      expect_near_all(prefix(reshape(yb, Shape{3, 1, 4}), b, 1), ref.data<float>(), 4, 1e-6f,
                      {"go_backwards"});
    }
  }
}

TEST(Masking, RecurrentGradientsWithMasks) {
  const Tensor x = random_tensor(Shape{2, 4, 3}, 8);
  // A mask with a hole in the middle as well as padding.
  const Tensor mask = Tensor::from_vector<float>({1, 0, 1, 1, 1, 1, 0, 0}, Shape{2, 4});
  for (int kind = 0; kind < 3; ++kind) {
    for (bool backwards : {false, true}) {
      SCOPED_TRACE(kind * 2 + backwards);
      RecurrentOptions o{.return_sequences = true,
                         .go_backwards = backwards,
                         .reset_after = kind != 2,
                         .seed = 12};
      std::shared_ptr<RecurrentLayer> l;
      if (kind == 0) {
        l = std::make_shared<LSTM>(3, o);
      } else {
        l = std::make_shared<GRU>(3, o);
      }
      auto f = [&](const Tensor& in) {
        std::vector<Tensor> s = l->call_with_states(in, mask);
        // The sequence and the final states.
        Tensor out = reshape(s[0], Shape{2, 12});
        for (size_t k = 1; k < s.size(); ++k) out = concat_last_axis(out, s[k]);
        return out;
      };
      EXPECT_LT(weights_gradcheck([&] { return f(x); }, l->trainable_weights()), kTol);
      EXPECT_LT(gradcheck([&](const std::vector<Tensor>& v) { return f(v[0]); }, {x}), kTol);
    }
  }
}

TEST(Masking, BidirectionalZeroesMaskedOutputsAndChecksGradients) {
  const Tensor x = random_tensor(Shape{2, 4, 3}, 9);
  const std::vector<int64_t> lens = {4, 2};
  const Tensor mask = length_mask(lens, 4);
  Bidirectional bi(LSTM(2, {.return_sequences = true, .seed = 13}), {.name = "bi"});
  const Tensor y = bi.call_masked(x, mask, false);
  ASSERT_EQ(y.shape(), (Shape{2, 4, 4}));
  for (int64_t b = 0; b < 2; ++b) {
    const Tensor ref = bi.call(prefix(x, b, lens[b]), false);
    for (int64_t t = 0; t < 4; ++t) {
      for (int64_t j = 0; j < 4; ++j) {
        const float got = y.data<float>()[(b * 4 + t) * 4 + j];
        if (t < lens[b]) {
          EXPECT_NEAR(got, ref.data<float>()[t * 4 + j], 1e-6);
        } else {
          EXPECT_EQ(got, 0.0f);  // zero_output_for_mask
        }
      }
    }
  }
  EXPECT_TRUE(bi.compute_mask(x, mask).defined());
  EXPECT_LT(weights_gradcheck([&] { return bi.call_masked(x, mask, false); }, bi.weights()), kTol);
  EXPECT_LT(
      gradcheck([&](const std::vector<Tensor>& v) { return bi.call_masked(v[0], mask, false); },
                {x}),
      kTol);
  // Without return_sequences: each row's final states.
  Bidirectional last(GRU(2, {.seed = 14}));
  const Tensor z = last.call_masked(x, mask, false);
  for (int64_t b = 0; b < 2; ++b) {
    const Tensor ref = last.call(prefix(x, b, lens[b]), false);
    expect_near_all(prefix(reshape(z, Shape{2, 1, 4}), b, 1), ref.data<float>(), 4, 1e-6f, {"bi"});
  }
  EXPECT_FALSE(last.compute_mask(x, mask).defined());
}

TEST(Masking, GlobalAveragePooling1DIsTheMaskedMean) {
  const Tensor x =
      Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60}, Shape{2, 3, 2});
  const Tensor mask = Tensor::from_vector<float>({1, 0, 1, 0, 0, 0}, Shape{2, 3});
  GlobalAveragePooling1D pool;
  const Tensor y = pool.call_masked(x, mask, false);
  // Row 0: mean of steps 0 and 2; row 1 fully masked: 0 (Keras would divide by zero).
  const float want[4] = {3, 4, 0, 0};
  expect_near_all(y, want, 4, 0, {"pool"});
  EXPECT_LT(
      gradcheck([&](const std::vector<Tensor>& v) { return pool.call_masked(v[0], mask, false); },
                {x}),
      kTol);
  GlobalAveragePooling1D keep({.keepdims = true});
  EXPECT_EQ(keep.call_masked(x, mask, false).shape(), (Shape{2, 1, 2}));
  // Channels first: x [B, C, T].
  GlobalAveragePooling1D cf({.data_format = "channels_first"});
  const Tensor xt = Tensor::from_vector<float>({1, 3, 5, 2, 4, 6}, Shape{1, 2, 3});
  const float want_cf[2] = {3, 4};
  expect_near_all(cf.call_masked(xt, Tensor::from_vector<float>({1, 0, 1}, Shape{1, 3}), false),
                  want_cf, 2, 0, {"channels_first"});
}

// A key padding mask equals attending over the unpadded keys; masks combine with the causal
// mask and an explicit attention_mask as Keras's _compute_attention_mask.
TEST(Masking, MultiHeadAttentionKeyPaddingQueryMaskAndCausal) {
  MultiHeadAttention mha(2, 3, {.seed = 15, .name = "mha"});
  const Tensor q = random_tensor(Shape{2, 3, 4}, 16);
  const Tensor v = random_tensor(Shape{2, 5, 4}, 17);
  const std::vector<int64_t> lens = {5, 2};
  const Tensor vmask = length_mask(lens, 5);
  const Tensor y = mha(q, v, {.value_mask = vmask});
  for (int64_t b = 0; b < 2; ++b) {
    const Tensor ref = mha(prefix(q, b, 3), prefix(v, b, lens[b]));
    expect_near_all(prefix(y, b, 3), ref.data<float>(), 12, 1e-5f, {"key padding"});
  }
  // Query mask + value mask + causal + explicit attention_mask == one explicit mask.
  const Tensor qmask = Tensor::from_vector<float>({1, 1, 0, 1, 0, 1}, Shape{2, 3});
  const Tensor am =
      Tensor::from_vector<float>({1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, Shape{1, 3, 5});
  Tensor full(Shape{2, 3, 5});
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t t = 0; t < 3; ++t)
      for (int64_t s = 0; s < 5; ++s) {
        const bool causal = s <= t;  // Keras's lower-triangular causal mask
        full.data<float>()[(b * 3 + t) * 5 + s] =
            qmask.data<float>()[b * 3 + t] * vmask.data<float>()[b * 5 + s] *
            am.data<float>()[t * 5 + s] * (causal ? 1.0f : 0.0f);
      }
  Tensor scores_a, scores_b;
  const Tensor a = mha(q, v,
                       {.attention_mask = am,
                        .use_causal_mask = true,
                        .query_mask = qmask,
                        .value_mask = vmask,
                        .attention_scores = &scores_a});
  const Tensor b = mha(q, v, {.attention_mask = full, .attention_scores = &scores_b});
  EXPECT_TRUE(a.equals(b));
  EXPECT_TRUE(scores_a.equals(scores_b));
  // Keys masked by the value mask (b 1, t 2, s 3) and by attention_mask (b 0, t 0, s 2) get
  // probability 0; a masked query row (b 1, t 1) is uniform, as in Keras.
  EXPECT_EQ(scores_a.data<float>()[((1 * 2 + 0) * 3 + 2) * 5 + 3], 0.0f);
  EXPECT_EQ(scores_a.data<float>()[((0 * 2 + 0) * 3 + 0) * 5 + 2], 0.0f);
  EXPECT_NEAR(scores_a.data<float>()[((1 * 2 + 1) * 3 + 1) * 5 + 4], 0.2f, 1e-6);
  // Gradients with masks, for the inputs and the weights. A masked query row is uniform and
  // constant in the inputs (its scores all sit at −1e9), so its float32 finite differences are 0
  // while the softmax backward, as TF's, gives the uniform row's gradient; the loss reads the
  // unmasked rows only (a masked loss, as a model with masking trains).
  const Tensor keep = reshape(qmask, Shape{2, 3, 1});
  auto f = [&](const Tensor& qq, const Tensor& vv) {
    return multiply(
        mha(qq, vv,
            {.use_causal_mask = true, .query_mask = qmask, .value_mask = vmask, .key_mask = vmask}),
        keep);
  };
  EXPECT_LT(weights_gradcheck([&] { return f(q, v); }, mha.trainable_weights()), kTol);
  EXPECT_LT(gradcheck([&](const std::vector<Tensor>& in) { return f(in[0], in[1]); }, {q, v}),
            kTol);
}

TEST(Masking, WrongMaskShapesNameTheLayer) {
  const Tensor x = random_tensor(Shape{2, 4, 3}, 18);
  const Tensor bad = Tensor::ones(Shape{2, 5});
  LSTM lstm(2, {.name = "enc"});
  expect_throws_with<InvalidArgumentError>([&] { lstm.call_masked(x, bad, false); },
                                           {"LSTM 'enc': the mask must be [batch, time] = [2, 4]"});
  GRU gru(2, {.name = "g"});
  expect_throws_with<InvalidArgumentError>(
      [&] { gru.call_masked(x, Tensor::ones(Shape{8}), false); }, {"GRU 'g': the mask"});
  MultiHeadAttention mha(1, 2, {.name = "att"});
  expect_throws_with<InvalidArgumentError>([&] { mha.call_masked(x, bad, false); },
                                           {"MultiHeadAttention 'att': the mask"});
  expect_throws_with<InvalidArgumentError>(
      [&] {
        mha(x, x, {.key_mask = Tensor::ones(Shape{3, 4})});
      },
      {"MultiHeadAttention 'att': the mask must be [batch, time] = [2, 4], got [3, 4]"});
  GlobalAveragePooling1D pool({.name = "gap"});
  expect_throws_with<InvalidArgumentError>([&] { pool.call_masked(x, bad, false); },
                                           {"GlobalAveragePooling1D 'gap': the mask"});
  Bidirectional bi(LSTM(2, {.return_sequences = true}), {.name = "bi"});
  expect_throws_with<InvalidArgumentError>([&] { bi.call_masked(x, bad, false); }, {"the mask"});
}

// Masking(mask_value): a step whose features all equal the value is masked and zeroed; a step
// with one feature different is not; the gradient passes to the unmasked steps only.
TEST(Masking, MaskingLayerMasksTheStepsOfTheMaskValue) {
  const float nan = std::nanf("");
  Tensor x = Tensor::from_vector<float>(
      {1, 2, 0, 0, 0, 0, 0, 3, 0, -1, -1, -1, 4, -1, 5, nan, 1, 1}, Shape{2, 3, 3});
  Masking zero;
  const Tensor y = zero(x);
  const Tensor m = zero.compute_mask(x, Tensor());
  ASSERT_EQ(m.shape(), (Shape{2, 3}));
  const std::vector<float> want_mask = {1, 0, 1, 1, 1, 1};
  for (int64_t s = 0; s < 6; ++s) {
    EXPECT_EQ(m.data<float>()[s], want_mask[s]) << s;
    for (int64_t f = 0; f < 3; ++f) {
      const float in = x.data<float>()[s * 3 + f], out = y.data<float>()[s * 3 + f];
      if (want_mask[s] == 0) {
        EXPECT_EQ(out, 0.0f) << s;
      } else if (std::isnan(in)) {
        EXPECT_TRUE(std::isnan(out)) << s;
      } else {
        EXPECT_EQ(out, in) << s;
      }
    }
  }
  // mask_value -1: only the second sample's first step; an incoming mask is replaced.
  Masking minus_one(-1.0f, {.name = "pad"});
  const Tensor m1 = minus_one.compute_mask(x, Tensor::ones(Shape{2, 3}));
  EXPECT_TRUE(m1.equals(Tensor::from_vector<float>({1, 1, 1, 0, 1, 1}, Shape{2, 3})));
  // A NaN mask_value masks nothing (not_equal is true for NaN).
  EXPECT_TRUE(Masking(nan).compute_mask(x, Tensor()).equals(Tensor::ones(Shape{2, 3})));

  const Tensor r = random_tensor(Shape{2, 3, 3}, 30);
  Tensor gx;
  {
    GradientTape tape;
    tape.watch(x);
    gx = tape.gradient(reduce_sum(multiply(zero(x), r)), x);
  }
  for (int64_t i = 0; i < 18; ++i) {
    EXPECT_EQ(gx.data<float>()[i], want_mask[i / 3] * r.data<float>()[i]) << i;
  }

  expect_throws_with<InvalidArgumentError>(
      [&] {
        Masking(0.0f, {.name = "flat"})(Tensor::ones(Shape{2, 3}));
      },
      {"Masking 'flat': expected inputs of rank 3 [batch, time, features]", "got [batch, 3]"});
}

// Masking → LSTM, in Sequential and rebuilt from Keras's JSON: a right-padded row gives what the
// same model gives on the row without its padding (the LSTM skips the masked steps).
TEST(Masking, MaskingBeforeAnLstmSkipsThePaddedSteps) {
  Tensor x = random_tensor(Shape{3, 5, 2}, 31);
  const std::vector<int64_t> lens = {5, 3, 1};
  for (int64_t b = 0; b < 3; ++b) {
    for (int64_t t = lens[b]; t < 5; ++t) {
      for (int64_t f = 0; f < 2; ++f) x.data<float>()[(b * 5 + t) * 2 + f] = -1.0f;
    }
  }
  // The LSTM pins the sequence length it is built for: each reference is a fresh model with the
  // same seed (the same weights).
  auto make = [](int64_t steps) {
    return Sequential({Masking(-1.0f, {.input_shape = Shape{steps, 2}}), LSTM(3, {.seed = 32})});
  };
  Sequential model = make(5);
  const Tensor y = model(x);
  ASSERT_EQ(y.shape(), (Shape{3, 3}));
  for (int64_t b = 0; b < 3; ++b) {
    Sequential ref_model = make(lens[b]);
    const Tensor ref = ref_model(prefix(x, b, lens[b]));
    expect_near_all(prefix(reshape(y, Shape{3, 1, 3}), b, 1), ref.data<float>(), 3, 1e-6f, "row");
  }
  // Without the Masking layer the padding counts.
  Sequential plain({LSTM(3, {.seed = 32})}), plain_short({LSTM(3, {.seed = 32})});
  EXPECT_GT(std::fabs(plain(x).data<float>()[6] - plain_short(prefix(x, 2, 1)).data<float>()[0]),
            1e-4);

  // The config Keras 2 writes for Masking, and back.
  const nlohmann::json cfg = nlohmann::json::parse(model.to_json());
  const nlohmann::json& mc = cfg["config"]["layers"][1];  // [0] is the InputLayer
  EXPECT_EQ(mc["class_name"], "Masking");
  EXPECT_EQ(mc["config"]["mask_value"], -1.0);
  const std::unique_ptr<Model> back = model_from_json(model.to_json());
  EXPECT_EQ(back->to_json(), model.to_json());
  const auto a = model.weights(), w = back->weights();
  ASSERT_EQ(a.size(), w.size());
  for (size_t i = 0; i < a.size(); ++i) w[i]->assign(a[i]->tensor());
  EXPECT_TRUE((*back)(x).equals(y));
  // Keras 3's form of the layer (a DTypePolicy, no batch shape).
  const std::unique_ptr<Model> k3 = model_from_json(R"({"class_name": "Sequential", "config": {
    "name": "s", "layers": [
    {"class_name": "InputLayer", "config": {"batch_shape": [null, 5, 2], "dtype": "float32",
     "sparse": false, "name": "input_layer"}},
    {"module": "keras.layers", "class_name": "Masking", "config": {"name": "masking",
     "trainable": true, "dtype": {"module": "keras", "class_name": "DTypePolicy",
     "config": {"name": "float32"}, "registered_name": null}, "mask_value": -1.0},
     "registered_name": null}]}})");
  const Tensor k3_mask = nn::call_with_output_mask(*k3, x, false).second;
  EXPECT_TRUE(k3_mask.equals(length_mask(lens, 5)));
}

// Sequential: Embedding(mask_zero) → Dense → LayerNormalization → Dropout → LSTM: each padded
// row equals the same model on the row without its padding.
TEST(Masking, SequentialPropagatesTheEmbeddingMask) {
  // Dense and LayerNormalization pin the sequence length they are built for, so each
  // reference is a fresh model with the same seeds (the same weights).
  auto make = [] {
    return Sequential({Embedding(9, 4, {.seed = 19, .mask_zero = true}), Dense(5, {.seed = 20}),
                       LayerNormalization(), Dropout(0.3f), LSTM(3, {.seed = 21})});
  };
  Sequential model = make();
  const Tensor ids =
      Tensor::from_vector<int32_t>({4, 2, 7, 1, 3, 8, 0, 0, 5, 0, 0, 0}, Shape{3, 4});
  const Tensor y = model(ids);
  ASSERT_EQ(y.shape(), (Shape{3, 3}));
  const std::vector<int64_t> lens = {4, 2, 1};
  for (int64_t b = 0; b < 3; ++b) {
    Tensor row(DType::kInt32, Shape{1, lens[b]});
    for (int64_t t = 0; t < lens[b]; ++t) row.data<int32_t>()[t] = ids.data<int32_t>()[b * 4 + t];
    Sequential ref_model = make();
    const Tensor ref = ref_model(row);
    expect_near_all(prefix(reshape(y, Shape{3, 1, 3}), b, 1), ref.data<float>(), 3, 1e-6f, {"row"});
  }
  // Without mask_zero the padding counts.
  auto unmasked = [] { return Sequential({Embedding(9, 4, {.seed = 19}), LSTM(3, {.seed = 21})}); };
  Sequential full = unmasked(), short_model = unmasked();
  const Tensor u = full(ids);
  Tensor row(DType::kInt32, Shape{1, 2});
  row.data<int32_t>()[0] = 3;
  row.data<int32_t>()[1] = 8;
  EXPECT_GT(std::fabs(u.data<float>()[3] - short_model(row).data<float>()[0]), 1e-4);
}

// Functional: ids → Embedding(mask_zero) → self-attention → Add (residual) → TimeDistributed
// (Dense) → GlobalAveragePooling1D, against the same layers run by hand with explicit masks.
TEST(Masking, FunctionalPropagatesMasksThroughAttentionAndMerges) {
  KerasTensor ids = Input(Shape{4});
  auto emb = shared(Embedding(9, 4, {.seed = 22, .mask_zero = true}));
  auto mha = shared(MultiHeadAttention(2, 2, {.seed = 23}));
  auto plus = shared(Add());
  auto td = shared(TimeDistributed(std::make_shared<Dense>(3, DenseOptions{.seed = 24})));
  auto pool = shared(GlobalAveragePooling1D());
  KerasTensor e = (*emb)(ids);
  KerasTensor a = (*mha)(std::vector<KerasTensor>{e, e});
  KerasTensor r = (*plus)(std::vector<KerasTensor>{e, a});
  KerasTensor y = (*pool)((*td)(r));
  Functional model({ids}, {y});
  const Tensor x = Tensor::from_vector<float>({4, 2, 7, 1, 3, 8, 0, 0}, Shape{2, 4});
  const Tensor got = model(x);
  const Tensor m = Tensor::from_vector<float>({1, 1, 1, 1, 1, 1, 0, 0}, Shape{2, 4});
  const Tensor he = (*emb)(x);
  const Tensor ha = (*mha)(he, he, {.query_mask = m, .value_mask = m});
  const Tensor want = pool->call_masked((*td)(add(he, ha)), m, false);
  EXPECT_TRUE(got.equals(want));
  // And the mask matters: the unmasked pipeline differs.
  const Tensor plain = (*pool)((*td)(add(he, (*mha)(he, he))));
  EXPECT_FALSE(got.equals(plain));
  // Functional with an RNN returning its states.
  KerasTensor ids2 = Input(Shape{4});
  auto emb2 = shared(Embedding(9, 4, {.seed = 25, .mask_zero = true}));
  auto gru = shared(GRU(3, {.return_sequences = true, .return_state = true, .seed = 26}));
  std::vector<KerasTensor> outs = gru->symbolic_call({(*emb2)(ids2)}, false);
  Functional rnn({ids2}, {outs[1]});
  const Tensor h = rnn(x);
  Tensor row(DType::kFloat32, Shape{1, 2});
  row.data<float>()[0] = 3;
  row.data<float>()[1] = 8;
  const Tensor ref = gru->call_with_states((*emb2)(row))[1];
  for (int64_t j = 0; j < 3; ++j) EXPECT_NEAR(h.data<float>()[3 + j], ref.data<float>()[j], 1e-6);
}

// --- PyTorch goldens -----------------------------------------------------------------------------

using nlohmann::json;

const json& mask_golden() { return testutil::golden_file("mask_golden.json"); }
Tensor tensor_of(const json& t) { return testutil::golden_tensor(t); }
void expect_close(const Tensor& actual, const json& expected, const std::string& what) {
  testutil::expect_close_to_golden(actual, expected, what);
}

TEST(MaskingGolden, MaskedLstmAndGruMatchTorch) {
  for (const json& c : mask_golden().at("rnn")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const bool lstm = c.at("cell") == "lstm";
    const int64_t units = c.at("units").get<int64_t>();
    std::unique_ptr<RecurrentLayer> layer;
    if (lstm) {
      layer = std::make_unique<LSTM>(units, RecurrentOptions{.return_sequences = true});
    } else {
      layer = std::make_unique<GRU>(units, RecurrentOptions{.return_sequences = true});
    }
    Tensor x = tensor_of(c.at("x"));
    const Tensor mask = tensor_of(c.at("mask"));
    layer->build(x.shape().without_first());
    const std::string prefix = layer->name() + (lstm ? "/lstm_cell/" : "/gru_cell/");
    for (Variable* v : layer->weights()) {
      v->assign(tensor_of(c.at("weights").at(v->name().substr(prefix.size()))));
    }
    std::vector<Variable*> vars = layer->trainable_weights();
    std::vector<Tensor> outs, gvars;
    Tensor gx;
    {
      GradientTape tape(/*persistent=*/true);
      tape.watch(x);
      outs = layer->call_with_states(x, mask);
      Tensor loss = reduce_sum(multiply(outs[0], tensor_of(c.at("r"))));
      if (lstm) loss = add(loss, reduce_sum(multiply(outs[2], tensor_of(c.at("r_c")))));
      gvars = tape.gradient(loss, vars);
      gx = tape.gradient(loss, x);
    }
    expect_close(outs[0], c.at("output"), "output");
    expect_close(outs[1], c.at("h"), "final h");
    if (lstm) expect_close(outs[2], c.at("c"), "final c");
    expect_close(gx, c.at("grad_x"), "d x");
    for (size_t i = 0; i < vars.size(); ++i) {
      const std::string key = vars[i]->name().substr(prefix.size());
      expect_close(gvars[i], c.at("grad_weights").at(key), "d " + key);
    }
  }
}

}  // namespace
}  // namespace dtrain::nn
