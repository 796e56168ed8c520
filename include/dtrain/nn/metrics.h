// Keras metrics (keras.metrics): stateful accumulators that fit() and evaluate() update once per
// batch and read once per epoch. They never record on a GradientTape (they read raw values) and
// accumulate in double, so an epoch's result is an exact count ratio or total. A Metric is
// thread-compatible: replicas keep their own metrics or synchronize updates themselves.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "dtrain/core/tensor.h"

namespace dtrain::nn {

class Loss;

class Metric {
 public:
  explicit Metric(std::string name) : name_(std::move(name)) {}
  virtual ~Metric() = default;

  // Adds one batch. Throws InvalidArgumentError naming both shapes when y_true and y_pred do
  // not fit, or naming the dtype when a tensor is not numeric.
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred) = 0;
  // Adds one batch with a weight per sample (Keras's sample_weight; fit and evaluate pass the
  // output's mask, nn/output_mask.h): the result is Σ value · weight / Σ weight. An undefined
  // `sample_weight` is update_state(y_true, y_pred). The accuracies and Mean take weights of
  // their per-sample values' shape (the accuracies: y_pred's without the class axis; Accuracy
  // and Mean: y_pred's); InvalidArgumentError naming both shapes otherwise. The default throws
  // InvalidArgumentError for defined weights (a metric that cannot weight).
  virtual void update_state(const Tensor& y_true, const Tensor& y_pred,
                            const Tensor& sample_weight);
  // The value over everything added since the last reset; 0 when nothing was added (Keras's
  // divide_no_nan).
  virtual double result() const = 0;
  // Forgets everything added.
  virtual void reset_state() = 0;
  // The name Keras reports in logs and History, e.g. "accuracy" or "sparse_categorical_accuracy".
  const std::string& name() const { return name_; }
  // The accumulated (total, count), and replacing it: how workers combine their metrics (sum
  // the states across workers, then set the sum everywhere).
  virtual std::pair<double, double> state() const = 0;
  virtual void set_state(double total, double count) = 0;

 private:
  std::string name_;
};

// The state every metric here keeps: a weighted total and a count, with result total / count
// (0 when nothing was added, Keras's divide_no_nan).
class WeightedMean : public Metric {
 public:
  using Metric::Metric;
  double result() const override { return count_ == 0 ? 0.0 : total_ / count_; }
  void reset_state() override { total_ = count_ = 0; }
  // The accumulated state, for summing across replicas.
  double total() const { return total_; }
  double count() const { return count_; }
  std::pair<double, double> state() const override { return {total_, count_}; }
  void set_state(double total, double count) override {
    total_ = total;
    count_ = count;
  }

 protected:
  void add(double total, double count) {
    total_ += total;
    count_ += count;
  }

 private:
  double total_ = 0;
  double count_ = 0;
};

// A weighted mean of values (keras.metrics.Mean); fit() tracks the loss with one.
class Mean : public WeightedMean {
 public:
  explicit Mean(std::string name = "mean") : WeightedMean(std::move(name)) {}
  // Adds `value` with weight `weight`.
  void update_state(double value, double weight = 1.0) { add(value * weight, weight); }
  // Adds every element of `values` (any numeric dtype) with weight 1.
  void update_state(const Tensor& values);
  // Adds the elements of y_pred with weight 1; y_true is ignored (Mean has no labels).
  void update_state(const Tensor& y_true, const Tensor& y_pred) override;
  // Adds the elements of y_pred, each with its weight.
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight) override;
};

// The mean of a per-example match value (Keras's MeanMetricWrapper): total matches / examples.
class MeanMetricWrapper : public WeightedMean {
 public:
  using WeightedMean::WeightedMean;
};

// argmax(y_pred) == y_true per example. y_pred [B, C] (or [..., C]) float32; y_true [B] or
// [B, 1] of class indices in any integer or float dtype (a non-integral label never matches).
class SparseCategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit SparseCategoricalAccuracy(std::string name = "sparse_categorical_accuracy")
      : MeanMetricWrapper(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override {
    update_state(y_true, y_pred, Tensor());
  }
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight) override;
};

// argmax(y_pred) == argmax(y_true) per example; y_true and y_pred [B, C] (first index wins ties).
class CategoricalAccuracy : public MeanMetricWrapper {
 public:
  explicit CategoricalAccuracy(std::string name = "categorical_accuracy")
      : MeanMetricWrapper(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override {
    update_state(y_true, y_pred, Tensor());
  }
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight) override;
};

struct BinaryAccuracyOptions {
  float threshold = 0.5f;  // y_pred > threshold counts as 1
};

// (y_pred > threshold) == y_true, averaged over the last axis per example, then over examples.
// y_true and y_pred of one shape [B, k], or [B] against [B, 1]; a rank-1 y_pred is B examples
// of one value each (Keras would count the whole batch as one value).
class BinaryAccuracy : public MeanMetricWrapper {
 public:
  explicit BinaryAccuracy(std::string name = "binary_accuracy", BinaryAccuracyOptions options = {})
      : MeanMetricWrapper(std::move(name)), options_(options) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override {
    update_state(y_true, y_pred, Tensor());
  }
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight) override;
  const BinaryAccuracyOptions& options() const { return options_; }

 private:
  BinaryAccuracyOptions options_;
};

// Exact elementwise equality y_true == y_pred (keras.metrics.Accuracy): every element counts
// once. Same shape, or [B] against [B, 1]; any numeric dtypes, compared as double.
class Accuracy : public MeanMetricWrapper {
 public:
  explicit Accuracy(std::string name = "accuracy") : MeanMetricWrapper(std::move(name)) {}
  void update_state(const Tensor& y_true, const Tensor& y_pred) override {
    update_state(y_true, y_pred, Tensor());
  }
  void update_state(const Tensor& y_true, const Tensor& y_pred,
                    const Tensor& sample_weight) override;
};

// A metric from the strings Keras's compile(metrics=[...]) accepts. "accuracy" and "acc"
// resolve as compile() does, keeping the given string as the reported name: to
// SparseCategoricalAccuracy when `loss` is a SparseCategoricalCrossentropy,
// CategoricalAccuracy for a CategoricalCrossentropy, BinaryAccuracy for a BinaryCrossentropy;
// for any other loss (or none) by Keras's shape rule on the first batch (y_pred's last
// dimension 1 → binary; y_true of lower rank or last dimension 1 → sparse; else categorical).
// Also "sparse_categorical_accuracy", "categorical_accuracy", "binary_accuracy" and the Keras
// class names (SparseCategoricalAccuracy, CategoricalAccuracy, BinaryAccuracy, Accuracy, Mean).
// Throws InvalidArgumentError naming the unknown name and listing the known ones.
std::shared_ptr<Metric> metric_from_name(const std::string& name, const Loss* loss = nullptr);

}  // namespace dtrain::nn
