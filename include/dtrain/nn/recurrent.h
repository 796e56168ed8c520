// Recurrent layers with Keras's names, defaults and weight layout: LSTM, GRU, and the wrappers
// Bidirectional and TimeDistributed. Thread-safety as for Layer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dtrain/nn/layer.h"
#include "dtrain/ops/recurrent.h"

namespace dtrain::nn {

// Options shared by LSTM and GRU (Keras's arguments and defaults).
struct RecurrentOptions {
  std::string activation = "tanh";               // linear, relu, sigmoid or tanh
  std::string recurrent_activation = "sigmoid";  // for the gates
  bool use_bias = true;
  bool return_sequences = false;  // output [batch, T, units] instead of the last step's
  bool return_state = false;      // call_list / call_with_states also give the final states
  bool go_backwards = false;      // read the sequence backwards (outputs in reading order)
  bool unit_forget_bias = true;   // LSTM: the forget gate's bias starts at 1
  bool reset_after = true;        // GRU: Keras 2/3 default (bias [2, 3u], CuDNN-compatible)
  std::string kernel_initializer = "glorot_uniform";
  std::string recurrent_initializer = "orthogonal";
  std::string bias_initializer = "zeros";
  std::optional<uint64_t> seed = std::nullopt;      // kernel and recurrent initializer seed
  std::optional<Shape> input_shape = std::nullopt;  // per-example [T, features]
  std::string name = {};                            // default "lstm" / "gru", ...
};

// The common machinery of LSTM and GRU: weights "<name>/<cell>/kernel" [features, G·units],
// "<cell>/recurrent_kernel" [units, G·units] and "<cell>/bias" ([G·units]; GRU with
// reset_after [2, 3·units]) with cell "lstm_cell" / "gru_cell", as Keras 2 and 3 name them.
// The state starts at zero (Keras's initial_state argument is not supported).
class RecurrentLayer : public Layer {
 public:
  Tensor call(const Tensor& x, bool training) override;
  // With a Keras mask [batch, T]: a masked step keeps the previous state and output (Keras's
  // masked rnn); the output keeps the mask with return_sequences, else has none.
  Tensor call_with_mask(const Tensor& x, const Tensor& mask, bool training) override;
  Tensor compute_mask(const Tensor& x, const Tensor& mask) const override;
  // {output, h} (GRU) or {output, h, c} (LSTM); {output} unless return_state.
  std::vector<Tensor> call_list(std::span<const Tensor> inputs, bool training) override;
  std::vector<Tensor> call_list_masked(std::span<const Tensor> inputs,
                                       std::span<const Tensor> masks, bool training) override;
  std::vector<Shape> compute_output_shapes(std::span<const Shape> input_shapes) const override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  // {output, final states...} regardless of return_state; `mask` optional as call_with_mask.
  std::vector<Tensor> call_with_states(const Tensor& x, const Tensor& mask = Tensor());
  std::string config_json() const override;

  int64_t units() const { return units_; }
  const RecurrentOptions& options() const { return options_; }
  bool is_lstm() const { return spec_.cell == ops::RecurrentCell::kLstm; }
  // The same layer (same options) under another name, reading the sequence forwards or
  // backwards: Bidirectional's forward_ and backward_ copies.
  virtual std::shared_ptr<RecurrentLayer> clone_as(const std::string& name,
                                                   bool go_backwards) const = 0;

 protected:
  RecurrentLayer(ops::RecurrentCell cell, int64_t units, RecurrentOptions options,
                 const char* default_name);
  void build_impl(const Shape& input_shape) override;

 private:
  ops::RecurrentSpec spec_;
  int64_t units_;
  RecurrentOptions options_;
  std::shared_ptr<Initializer> kernel_init_, recurrent_init_, bias_init_;
  Variable* kernel_ = nullptr;
  Variable* recurrent_kernel_ = nullptr;
  Variable* bias_ = nullptr;
  std::string where_;
};

// keras.layers.LSTM: gates i, f, c, o in the kernel's column blocks.
class LSTM : public RecurrentLayer {
 public:
  explicit LSTM(int64_t units, RecurrentOptions options = {});
  std::string class_name() const override { return "LSTM"; }
  std::shared_ptr<RecurrentLayer> clone_as(const std::string& name,
                                           bool go_backwards) const override;
};

// keras.layers.GRU: gates z, r, h in the kernel's column blocks; reset_after as Keras.
class GRU : public RecurrentLayer {
 public:
  explicit GRU(int64_t units, RecurrentOptions options = {});
  std::string class_name() const override { return "GRU"; }
  std::shared_ptr<RecurrentLayer> clone_as(const std::string& name,
                                           bool go_backwards) const override;
};

struct BidirectionalOptions {
  std::string merge_mode = "concat";                // concat, sum, mul, ave
  std::optional<Shape> input_shape = std::nullopt;  // per-example [T, features]
  std::string name = {};                            // default "bidirectional", ...
};

// keras.layers.Bidirectional: runs a copy of `layer` forwards ("<name>/forward_<layer>") and
// one backwards ("<name>/backward_<layer>"), reverses the backward outputs back into time order
// when they are sequences, and merges the two. With return_state, call_list gives {merged,
// forward states..., backward states...}.
class Bidirectional : public Layer {
 public:
  Bidirectional(const RecurrentLayer& layer, BidirectionalOptions options = {});
  std::string class_name() const override { return "Bidirectional"; }
  Tensor call(const Tensor& x, bool training) override;
  // Both directions honour the mask; with return_sequences the masked steps' outputs are zero
  // (Keras sets zero_output_for_mask in Bidirectional), and the output keeps the mask.
  Tensor call_with_mask(const Tensor& x, const Tensor& mask, bool training) override;
  Tensor compute_mask(const Tensor& x, const Tensor& mask) const override;
  std::vector<Tensor> call_list(std::span<const Tensor> inputs, bool training) override;
  std::vector<Tensor> call_list_masked(std::span<const Tensor> inputs,
                                       std::span<const Tensor> masks, bool training) override;
  std::vector<Shape> compute_output_shapes(std::span<const Shape> input_shapes) const override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::vector<Variable*> weights() override;
  std::string config_json() const override;
  RecurrentLayer& forward_layer() { return *forward_; }
  RecurrentLayer& backward_layer() { return *backward_; }

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  std::vector<Tensor> run(const Tensor& x, const Tensor& mask);
  std::shared_ptr<RecurrentLayer> forward_, backward_;
  std::string merge_mode_;
};

struct TimeDistributedOptions {
  std::optional<Shape> input_shape = std::nullopt;  // per-example [T, ...]
  std::string name = {};                            // default "time_distributed", ...
};

// keras.layers.TimeDistributed: applies `layer` to every time step, by folding time into the
// batch ([B, T, ...] → [B·T, ...] → layer → [B, T, ...]). The wrapped layer keeps its own
// weight names.
class TimeDistributed : public Layer {
 public:
  TimeDistributed(std::shared_ptr<Layer> layer, TimeDistributedOptions options = {});
  std::string class_name() const override { return "TimeDistributed"; }
  bool supports_masking() const override { return true; }  // passes the time mask on
  Tensor call(const Tensor& x, bool training) override;
  Shape compute_output_shape(const Shape& input_shape) const override;
  std::vector<Variable*> weights() override;
  std::string config_json() const override;
  Layer& layer() { return *layer_; }

 protected:
  void build_impl(const Shape& input_shape) override;

 private:
  std::shared_ptr<Layer> layer_;
};

}  // namespace dtrain::nn
