// Functional::summary(): TF-Keras 2's print_summary (keras/utils/layer_utils.py) for graph
// networks: line length 98, columns at 0.33/0.55/0.67 with "Connected to", or the
// Sequential-like table (65 columns at 0.45/0.85) when the graph is a chain.
#include <algorithm>
#include <iostream>
#include <set>

#include "dtrain/nn/functional.h"

namespace dtrain::nn {

namespace {

std::string group_thousands(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}

// Python's str() of a shape tuple with a None batch: "(None, 64)".
std::string shape_tuple(const Shape& s) {
  std::string out = "(None";
  for (int64_t d : s) out += ", " + std::to_string(d);
  return out + ")";
}

// Python's str() of a list of strings: "['a[0][0]', 'b[0][0]']".
std::string string_list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", '" : "'") + items[i] + "'";
  return out + "]";
}

// Keras's print_row: each field is cut to its column (less 2 spaces, except the last), broken
// early after "),", "},", "]," or "',", and continued on further lines.
void print_row(std::ostream& os, std::vector<std::string> fields, const std::vector<int>& pos) {
  auto any_left = [&] {
    return std::any_of(fields.begin(), fields.end(), [](const auto& f) { return !f.empty(); });
  };
  while (any_left()) {
    std::string line;
    for (size_t col = 0; col < fields.size(); ++col) {
      const int start = col > 0 ? pos[col - 1] : 0;
      const int space = col != pos.size() - 1 ? 2 : 0;
      size_t cutoff = static_cast<size_t>(std::max(0, pos[col] - start - space));
      std::string fit = fields[col].substr(0, cutoff);
      size_t best = std::string::npos;
      for (const char* brk : {"),", "},", "],", "',"}) {
        const size_t f = fit.find(brk);
        if (f != std::string::npos) best = std::min(best, f + 2);
      }
      if (best != std::string::npos) {
        cutoff = best;
        fit = fit.substr(0, cutoff);
      }
      if (col == 0) line += " ";
      line += fit;
      line += std::string(static_cast<size_t>(space), ' ');
      fields[col] = fields[col].size() > cutoff ? fields[col].substr(cutoff) : std::string();
      if (static_cast<int>(line.size()) < pos[col]) {
        line += std::string(static_cast<size_t>(pos[col]) - line.size(), ' ');
      }
    }
    os << line << "\n";
  }
}

int64_t count(const std::vector<Variable*>& vars) {
  int64_t n = 0;
  for (const Variable* v : vars) n += v->shape().num_elements();
  return n;
}

}  // namespace

void Functional::summary(std::ostream& os) const {
  auto& self = const_cast<Functional&>(*this);
  // Keras prints a graph as a chain (without "Connected to") when no depth has two nodes or a
  // node with several inputs, and no layer is called twice.
  bool sequential_like = true;
  std::set<const Layer*> called;
  for (const auto& n : nodes_) {
    if (n->inputs.size() > 1 || !called.insert(n->layer.get()).second) sequential_like = false;
  }
  for (const auto& n : nodes_) {
    // Two nodes at one depth exist exactly when a node feeds two consumers or there are two
    // inputs/outputs; a chain has each node consumed once.
    int consumers = 0;
    for (const auto& m : nodes_) {
      for (const KerasTensor& x : m->inputs) consumers += x.node() == n ? 1 : 0;
    }
    if (consumers > 1) sequential_like = false;
  }
  if (inputs_.size() > 1 || outputs_.size() > 1) sequential_like = false;

  const int line_length = sequential_like ? 65 : 98;
  std::vector<int> pos;
  for (double p : sequential_like ? std::vector<double>{0.45, 0.85, 1.0}
                                  : std::vector<double>{0.33, 0.55, 0.67, 1.0}) {
    pos.push_back(static_cast<int>(line_length * p));
  }
  std::vector<std::string> header = {"Layer (type)", "Output Shape", "Param #"};
  if (!sequential_like) header.push_back("Connected to");
  os << "Model: \"" << name() << "\"\n" << std::string(line_length, '_') << "\n";
  print_row(os, header, pos);
  os << std::string(line_length, '=') << "\n";

  for (const auto& layer : layers()) {
    // Output shape: the same for every node of the layer in this model, else "multiple"; an
    // InputLayer's (and a multi-output layer's) is a list.
    std::vector<const detail::SymbolicNode*> own;
    for (const auto& n : nodes_) {
      if (n->layer == layer) own.push_back(n.get());
    }
    std::string shape = "multiple";
    if (!own.empty()) {
      bool same = true;
      for (const auto* n : own) same = same && n->output_shapes == own[0]->output_shapes;
      if (same) {
        const auto& shapes = own[0]->output_shapes;
        if (shapes.size() == 1 && !own[0]->is_input()) {
          shape = shape_tuple(shapes[0]);
        } else {
          shape = "[";
          for (size_t i = 0; i < shapes.size(); ++i)
            shape += (i ? ", " : "") + shape_tuple(shapes[i]);
          shape += "]";
        }
      }
    }
    std::vector<std::string> fields = {layer->name() + " (" + layer->class_name() + ")", shape,
                                       std::to_string(layer->count_params())};
    if (!sequential_like) {
      std::vector<std::string> connections;
      for (const auto* n : own) {
        for (const KerasTensor& x : n->inputs) {
          connections.push_back(str_cat(x.layer().name(), "[", config_node_index(*x.node()), "][",
                                        x.tensor_index(), "]"));
        }
      }
      fields.push_back(string_list(connections));
    }
    print_row(os, fields, pos);
    os << std::string(line_length, ' ') << "\n";
  }
  os << std::string(line_length, '=') << "\n";
  const int64_t total = count(self.weights()), trainable = count(self.trainable_weights());
  os << "Total params: " << group_thousands(total) << "\n";
  os << "Trainable params: " << group_thousands(trainable) << "\n";
  os << "Non-trainable params: " << group_thousands(total - trainable) << "\n"
     << std::string(line_length, '_') << "\n";
}

}  // namespace dtrain::nn
