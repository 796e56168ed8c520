// Merging layers: Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate, Dot.
#include "dtrain/nn/merging.h"

#include "config.h"
#include "dtrain/autograd/array_ops.h"
#include "dtrain/autograd/attention.h"
#include "dtrain/autograd/functions.h"
#include "dtrain/autograd/reshaping.h"
#include "layer_registry.h"

namespace dtrain::nn {

using nlohmann::json;

Tensor Merge::call(const Tensor&, bool) {
  throw InvalidArgumentError(str_cat(class_name(), " '", name(),
                                     "': a merge layer must be called on a list of at least 2 "
                                     "inputs, got one tensor"));
}

std::vector<Tensor> Merge::call_list(std::span<const Tensor> inputs, bool) {
  std::vector<Shape> shapes;
  for (size_t i = 0; i < inputs.size(); ++i) {
    DTRAIN_CHECK(inputs[i].defined() && inputs[i].rank() >= 1, class_name(), " '", name(),
                 "': input ", i, " must have a batch dimension");
    DTRAIN_CHECK(inputs[i].dim(0) == inputs[0].dim(0), class_name(), " '", name(),
                 "': inputs have different batch sizes ", inputs[0].shape().to_string(), " and ",
                 inputs[i].shape().to_string());
    shapes.push_back(inputs[i].shape().without_first());
  }
  if (!built()) build_list(shapes);
  merged_shape(shapes);  // checks
  return {merge(inputs)};
}

void Merge::build_list(std::span<const Shape> input_shapes) {
  merged_shape(input_shapes);
  if (!built()) mark_built();
}

std::vector<Shape> Merge::compute_output_shapes(std::span<const Shape> input_shapes) const {
  return {merged_shape(input_shapes)};
}

Shape Merge::merged_shape(std::span<const Shape> shapes) const {
  const size_t n = arity();
  if (n != 0) {
    DTRAIN_CHECK(shapes.size() == n, class_name(), " '", name(), "': expects exactly ", n,
                 " inputs, got ", shapes.size());
  } else {
    DTRAIN_CHECK(shapes.size() >= 2, class_name(), " '", name(),
                 "': a merge layer needs at least 2 inputs, got ", shapes.size());
  }
  Shape out = shapes[0];
  for (size_t k = 1; k < shapes.size(); ++k) {
    const Shape& s = shapes[k];
    bool ok = s.rank() == out.rank();
    for (int i = 0; ok && i < s.rank(); ++i) {
      if (out[i] == s[i] || s[i] == 1) continue;
      if (out[i] == 1) {
        out[i] = s[i];
        continue;
      }
      ok = false;
    }
    DTRAIN_CHECK(ok, class_name(), " '", name(), "': inputs have incompatible shapes ",
                 shapes[0].to_string(), " and ", s.to_string(), " (input ", k, ")");
  }
  return out;
}

namespace {
template <class F>
Tensor fold(std::span<const Tensor> xs, F f) {
  Tensor acc = f(xs[0], xs[1]);
  for (size_t i = 2; i < xs.size(); ++i) acc = f(acc, xs[i]);
  return acc;
}
}  // namespace

Add::Add(MergeOptions o) : Merge(detail::name_or_default(o.name, "add")) {}
Tensor Add::merge(std::span<const Tensor> xs) const {
  return fold(xs, [](const Tensor& a, const Tensor& b) { return add(a, b); });
}

Multiply::Multiply(MergeOptions o) : Merge(detail::name_or_default(o.name, "multiply")) {}
Tensor Multiply::merge(std::span<const Tensor> xs) const {
  return fold(xs, [](const Tensor& a, const Tensor& b) { return multiply(a, b); });
}

Average::Average(MergeOptions o) : Merge(detail::name_or_default(o.name, "average")) {}
Tensor Average::merge(std::span<const Tensor> xs) const {
  const Tensor sum = fold(xs, [](const Tensor& a, const Tensor& b) { return add(a, b); });
  return scale(sum, 1.0f / static_cast<float>(xs.size()));
}

Maximum::Maximum(MergeOptions o) : Merge(detail::name_or_default(o.name, "maximum")) {}
Tensor Maximum::merge(std::span<const Tensor> xs) const {
  return fold(xs, [](const Tensor& a, const Tensor& b) { return maximum(a, b); });
}

Minimum::Minimum(MergeOptions o) : Merge(detail::name_or_default(o.name, "minimum")) {}
Tensor Minimum::merge(std::span<const Tensor> xs) const {
  return fold(xs, [](const Tensor& a, const Tensor& b) { return minimum(a, b); });
}

Subtract::Subtract(MergeOptions o) : Merge(detail::name_or_default(o.name, "subtract")) {}
Tensor Subtract::merge(std::span<const Tensor> xs) const { return subtract(xs[0], xs[1]); }

// ---------------------------------------------------------------------------------------------

Concatenate::Concatenate(ConcatenateOptions o)
    : Merge(detail::name_or_default(o.name, "concatenate")), axis_(o.axis) {}

Shape Concatenate::merged_shape(std::span<const Shape> shapes) const {
  DTRAIN_CHECK(shapes.size() >= 2, "Concatenate '", name(), "': needs at least 2 inputs, got ",
               shapes.size());
  const int rank = shapes[0].rank() + 1;  // with the batch dimension
  const int a = axis_ < 0 ? axis_ + rank : axis_;
  DTRAIN_CHECK(a >= 1 && a < rank, "Concatenate '", name(), "': axis ", axis_,
               " is out of range for inputs of shape [batch", shapes[0].rank() ? ", " : "",
               shapes[0].to_string().substr(1), " (the batch axis 0 cannot be concatenated)");
  Shape out = shapes[0];
  for (size_t k = 1; k < shapes.size(); ++k) {
    const Shape& s = shapes[k];
    bool ok = s.rank() == out.rank();
    for (int i = 0; ok && i < s.rank(); ++i) ok = i == a - 1 || s[i] == out[i];
    DTRAIN_CHECK(ok, "Concatenate '", name(), "': inputs ", shapes[0].to_string(), " and ",
                 s.to_string(), " (input ", k, ") must agree except along axis ", axis_);
    out[a - 1] += s[a - 1];
  }
  return out;
}

Tensor Concatenate::merge(std::span<const Tensor> xs) const {
  const int a = axis_ < 0 ? axis_ + xs[0].rank() : axis_;
  return concat(xs, a);
}

std::string Concatenate::config_json() const {
  json c = detail::base_config(*this);
  c["axis"] = axis_;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

Dot::Dot(DotOptions o) : Merge(detail::name_or_default(o.name, "dot")), options_(std::move(o)) {}

std::array<int, 2> Dot::example_axes(std::span<const Shape> shapes) const {
  DTRAIN_CHECK(shapes.size() == 2, "Dot '", name(), "': expects exactly 2 inputs, got ",
               shapes.size());
  std::array<int, 2> out{};
  for (int i = 0; i < 2; ++i) {
    const int rank = shapes[i].rank() + 1;  // with the batch dimension
    const int a = options_.axes[i] < 0 ? options_.axes[i] + rank : options_.axes[i];
    DTRAIN_CHECK(rank >= 2 && a >= 1 && a < rank, "Dot '", name(), "': axis ", options_.axes[i],
                 " is out of range for input ", i, " of shape [batch", shapes[i].rank() ? ", " : "",
                 shapes[i].to_string().substr(1), " (the batch axis 0 cannot be contracted)");
    out[i] = a - 1;
  }
  DTRAIN_CHECK(shapes[0][out[0]] == shapes[1][out[1]], "Dot '", name(), "': the inputs' axes ",
               out[0] + 1, " and ", out[1] + 1, " differ in size (", shapes[0].to_string(), " and ",
               shapes[1].to_string(), ")");
  return out;
}

Shape Dot::merged_shape(std::span<const Shape> shapes) const {
  const std::array<int, 2> a = example_axes(shapes);
  std::vector<int64_t> dims;
  for (int i = 0; i < 2; ++i) {
    for (int d = 0; d < shapes[i].rank(); ++d) {
      if (d != a[i]) dims.push_back(shapes[i][d]);
    }
  }
  if (dims.empty()) dims.push_back(1);  // batch_dot of two vectors: [B, 1]
  return Shape(dims);
}

namespace {

// x / max(‖x‖₂ along `axis`, 1e-6) (Keras's l2_normalize: x / sqrt(max(Σx², 1e-12))).
Tensor l2_normalize(const Tensor& x, int axis) {
  const Tensor sq = reduce_sum(square(x), axis, /*keepdims=*/true);
  return divide(x, sqrt(maximum(sq, Tensor::scalar(1e-12f))));
}

// x with its axis `a` moved to position `to` (both counting the batch).
Tensor move_axis(const Tensor& x, int a, int to) {
  std::vector<int> perm;
  for (int d = 0; d < x.rank(); ++d) {
    if (d != a) perm.push_back(d);
  }
  perm.insert(perm.begin() + to, a);
  bool identity = true;
  for (int d = 0; d < x.rank(); ++d) identity = identity && perm[static_cast<size_t>(d)] == d;
  return identity ? x : transpose(x, perm);
}

}  // namespace

Tensor Dot::merge(std::span<const Tensor> xs) const {
  const std::vector<Shape> shapes = {xs[0].shape().without_first(), xs[1].shape().without_first()};
  const std::array<int, 2> a = example_axes(shapes);
  Tensor x = options_.normalize ? l2_normalize(xs[0], a[0] + 1) : xs[0];
  Tensor y = options_.normalize ? l2_normalize(xs[1], a[1] + 1) : xs[1];
  const int64_t batch = xs[0].dim(0), k = shapes[0][a[0]];
  // x → [B, M, K], y → [B, K, N]; one batched GEMM; then the kept dimensions back.
  x = move_axis(x, a[0] + 1, x.rank() - 1);
  y = move_axis(y, a[1] + 1, 1);
  const int64_t m = x.num_elements() / (batch * k), n = y.num_elements() / (batch * k);
  const Tensor out = batch_matmul(reshape(x, Shape{batch, m, k}), reshape(y, Shape{batch, k, n}));
  return reshape(out, merged_shape(shapes).with_first(batch));
}

std::string Dot::config_json() const {
  json c = detail::base_config(*this);
  if (options_.axes[0] == options_.axes[1]) {
    c["axes"] = options_.axes[0];
  } else {
    c["axes"] = {options_.axes[0], options_.axes[1]};
  }
  c["normalize"] = options_.normalize;
  return c.dump();
}

// ---------------------------------------------------------------------------------------------

namespace {

template <class L>
std::shared_ptr<Layer> merge_from_config(const json& c, const std::string& where) {
  return std::make_shared<L>(MergeOptions{.name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> concatenate_from_config(const json& c, const std::string& where) {
  return std::make_shared<Concatenate>(
      ConcatenateOptions{.axis = static_cast<int>(detail::int_field(c, "axis", where, -1)),
                         .name = detail::str_field(c, "name", where)});
}

std::shared_ptr<Layer> dot_from_config(const json& c, const std::string& where) {
  DotOptions o{.name = detail::str_field(c, "name", where)};
  DTRAIN_CHECK(c.contains("axes"), where, ": Dot needs \"axes\"");
  const json& axes = c["axes"];
  if (axes.is_number_integer()) {
    o.axes = {axes.get<int>(), axes.get<int>()};
  } else {
    DTRAIN_CHECK(axes.is_array() && axes.size() == 2 && axes[0].is_number_integer() &&
                     axes[1].is_number_integer(),
                 where, ": Dot axes must be an integer or a list of two, got ", axes.dump());
    o.axes = {axes[0].get<int>(), axes[1].get<int>()};
  }
  o.normalize = detail::bool_field(c, "normalize", where, false);
  return std::make_shared<Dot>(o);
}

}  // namespace

namespace detail {
void register_merging_layers(LayerRegistry& registry) {
  registry.add("Add", merge_from_config<Add>);
  registry.add("Subtract", merge_from_config<Subtract>);
  registry.add("Multiply", merge_from_config<Multiply>);
  registry.add("Average", merge_from_config<Average>);
  registry.add("Maximum", merge_from_config<Maximum>);
  registry.add("Minimum", merge_from_config<Minimum>);
  registry.add("Concatenate", concatenate_from_config);
  registry.add("Dot", dot_from_config);
}
}  // namespace detail

}  // namespace dtrain::nn
