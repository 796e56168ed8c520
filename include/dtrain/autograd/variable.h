// Variable: a named, mutable tensor that training updates (tf.Variable). Reading value() while
// a GradientTape is recording makes the read differentiable when the variable is trainable.
// A Variable is not copyable (it has an identity); thread-compatible: replicas that share one
// variable must not update it concurrently.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "dtrain/core/tensor.h"

namespace dtrain {

class Variable {
 public:
  // Takes `initial` as its value (not copied: pass clone() to keep the original separate).
  Variable(std::string name, Tensor initial, bool trainable = true);
  ~Variable();
  Variable(const Variable&) = delete;
  Variable& operator=(const Variable&) = delete;

  // How many variables this process has created and destroyed so far: unchanged between two
  // reads, no variable came or went (a cheap test that a walk over variables is still current).
  static uint64_t lifetime_events();

  // The name as Keras gives it, e.g. "dense/kernel:0" drops the ":0": "dense/kernel".
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }
  bool trainable() const { return trainable_; }
  void set_trainable(bool t) { trainable_ = t; }
  // Unique among the variables of this process; never reused.
  int64_t id() const { return id_; }
  const Shape& shape() const { return value_.shape(); }
  DType dtype() const { return value_.dtype(); }

  // The current value as a tensor sharing the variable's buffer. Recorded on the active
  // gradient tape (as a leaf) when the variable is trainable or watched by that tape.
  Tensor value() const;
  // The buffer itself, for optimizers and checkpoints: writes through it change the variable
  // in place and are not recorded.
  Tensor& tensor() { return value_; }
  const Tensor& tensor() const { return value_; }

  // Copies `v` into the variable (same shape and dtype, else InvalidArgumentError).
  void assign(const Tensor& v);
  void assign_add(const Tensor& v);
  void assign_sub(const Tensor& v);

 private:
  std::string name_;
  Tensor value_;
  bool trainable_;
  int64_t id_;
};

}  // namespace dtrain
