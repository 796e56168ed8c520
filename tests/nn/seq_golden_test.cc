// Compares dtrain's sequence layers, forward and backward, with golden values computed by
// PyTorch (tools/golden/gen_seq_golden.py writes tests/golden/seq_golden.json; the generator
// cross-checks Keras's formulas against torch.nn.MultiheadAttention / LSTM / GRU). Tolerance:
// 1e-5 relative plus 1e-6 absolute.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/gradient_tape.h"
#include "dtrain/nn/attention.h"
#include "dtrain/nn/recurrent.h"
#include "testutil/golden.h"

namespace dtrain::nn {
namespace {

using nlohmann::json;

const json& golden() { return testutil::golden_file("seq_golden.json"); }
Tensor tensor_of(const json& t) { return testutil::golden_tensor(t); }
void expect_close(const Tensor& actual, const json& expected, const std::string& what) {
  testutil::expect_close_to_golden(actual, expected, what);
}

// Sets each weight of `layer` named "<layer>/<key>" from the golden weights.
void load_weights(Layer& layer, const json& weights) {
  size_t loaded = 0;
  for (Variable* v : layer.weights()) {
    const std::string key = v->name().substr(layer.name().size() + 1);
    ASSERT_TRUE(weights.contains(key)) << "no golden weight for " << v->name();
    v->assign(tensor_of(weights[key]));
    ++loaded;
  }
  EXPECT_EQ(loaded, weights.size()) << "golden weights the layer does not have";
}

TEST(SeqGolden, MultiHeadAttentionMatchesTorch) {
  for (const json& c : golden().at("mha")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const bool self = c.at("self_attention").get<bool>();
    MultiHeadAttention mha(c.at("num_heads").get<int64_t>(), c.at("key_dim").get<int64_t>(),
                           {.value_dim = c.at("value_dim").get<int64_t>(),
                            .use_bias = c.at("use_bias").get<bool>(),
                            .output_shape = c.at("output_shape").get<int64_t>()});
    Tensor query = tensor_of(c.at("query"));
    Tensor value = self ? query : tensor_of(c.at("value"));
    Tensor key = self ? query : tensor_of(c.at("key"));
    const Shape shapes[3] = {query.shape().without_first(), value.shape().without_first(),
                             key.shape().without_first()};
    mha.build_list(std::span<const Shape>(shapes, 3));
    load_weights(mha, c.at("weights"));
    std::vector<Variable*> vars = mha.trainable_weights();
    Tensor scores;
    Tensor out;
    std::vector<Tensor> grad_vars, grad_inputs;
    {
      GradientTape tape(/*persistent=*/true);
      tape.watch(query);
      if (self) {
        value = key = query;
      } else {
        tape.watch(value);
        tape.watch(key);
      }
      out = mha(query, value,
                {.key = key,
                 .attention_mask = c.contains("mask") ? tensor_of(c.at("mask")) : Tensor(),
                 .use_causal_mask = c.at("causal").get<bool>(),
                 .attention_scores = &scores});
      const Tensor loss = reduce_sum(multiply(out, tensor_of(c.at("r"))));
      grad_vars = tape.gradient(loss, vars);
      grad_inputs = self ? tape.gradient(loss, std::vector<Tensor>{query})
                         : tape.gradient(loss, std::vector<Tensor>{query, value, key});
    }
    expect_close(out, c.at("output"), "output");
    expect_close(scores, c.at("scores"), "attention scores");
    expect_close(grad_inputs[0], c.at("grad_query"), "d query");
    if (!self) {
      expect_close(grad_inputs[1], c.at("grad_value"), "d value");
      expect_close(grad_inputs[2], c.at("grad_key"), "d key");
    }
    for (size_t i = 0; i < vars.size(); ++i) {
      const std::string key_name = vars[i]->name().substr(mha.name().size() + 1);
      expect_close(grad_vars[i], c.at("grad_weights").at(key_name), "d " + key_name);
    }
  }
}

TEST(SeqGolden, LstmAndGruMatchTorch) {
  for (const json& c : golden().at("rnn")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    const bool lstm = c.at("cell") == "lstm";
    const RecurrentOptions o{.return_sequences = c.at("return_sequences").get<bool>(),
                             .go_backwards = c.at("go_backwards").get<bool>(),
                             .reset_after = c.at("reset_after").get<bool>()};
    const int64_t units = c.at("units").get<int64_t>();
    std::unique_ptr<RecurrentLayer> layer;
    if (lstm) {
      layer = std::make_unique<LSTM>(units, o);
    } else {
      layer = std::make_unique<GRU>(units, o);
    }
    Tensor x = tensor_of(c.at("x"));
    layer->build(x.shape().without_first());
    const std::string cell = lstm ? "lstm_cell/" : "gru_cell/";
    for (Variable* v : layer->weights()) {
      const std::string key = v->name().substr(layer->name().size() + 1 + cell.size());
      ASSERT_EQ(v->name(), layer->name() + "/" + cell + key);
      v->assign(tensor_of(c.at("weights").at(key)));
    }
    std::vector<Variable*> vars = layer->trainable_weights();
    std::vector<Tensor> outs, gvars;
    Tensor gx;
    {
      GradientTape tape(/*persistent=*/true);
      tape.watch(x);
      outs = layer->call_with_states(x);
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
      const std::string key = vars[i]->name().substr(layer->name().size() + 1 + cell.size());
      expect_close(gvars[i], c.at("grad_weights").at(key), "d " + key);
    }
  }
}

}  // namespace
}  // namespace dtrain::nn
