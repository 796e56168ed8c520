// The object-graph view: children, values and slot variables of every trackable reachable from
// the root, with TF2's keys (graph_view.h).
#include "graph_view.h"

#include <bit>
#include <deque>
#include <map>
#include <optional>
#include <set>

#include "dtrain/core/error.h"
#include "dtrain/data/dataset.h"
#include "dtrain/nn/functional.h"
#include "dtrain/nn/model.h"
#include "dtrain/optim/optimizer.h"

namespace dtrain::checkpoint::detail {

namespace {

Tensor int64_pair(int64_t a, int64_t b) { return Tensor::from_vector<int64_t>({a, b}, Shape{2}); }

// "dense/kernel" of layer "dense" → "kernel".
std::string weight_attribute(const std::string& layer_name, const std::string& var_name) {
  if (var_name.size() > layer_name.size() + 1 &&
      var_name.compare(0, layer_name.size(), layer_name) == 0 &&
      var_name[layer_name.size()] == '/') {
    return var_name.substr(layer_name.size() + 1);
  }
  const size_t slash = var_name.find_last_of('/');
  return slash == std::string::npos ? var_name : var_name.substr(slash + 1);
}

std::string child_path(const std::string& parent, const std::string& local_name) {
  return parent.empty() ? escape_local_name(local_name)
                        : parent + "/" + escape_local_name(local_name);
}
}  // namespace

std::vector<std::pair<std::string, Trackable>> GraphView::children_of(const Trackable& t,
                                                                      const std::string& path) {
  std::vector<std::pair<std::string, Trackable>> out;
  switch (t.kind_) {
    case Trackable::Kind::kLayer: {
      auto* layer = static_cast<nn::Layer*>(t.ptr_);
      auto* model = dynamic_cast<nn::Model*>(layer);
      // The layer's (or model's) own variables.
      for (Variable* v : layer->nn::Layer::weights()) {
        out.emplace_back(weight_attribute(layer->name(), v->name()), Trackable(*v));
      }
      if (model == nullptr) break;
      UnbuiltModel unbuilt{path, {}};
      const auto& layers = model->layers();
      const bool functional = dynamic_cast<nn::Functional*>(model) != nullptr;
      if (functional || dynamic_cast<nn::Sequential*>(model) != nullptr) {
        // Keras Functional/Sequential: layer_with_weights-<j> before layer-<i>. Sequential's
        // layers exclude its InputLayer; a Functional's include its InputLayers (Keras's
        // Functional.layers), which take layer-<i> numbers.
        int i = 0, j = 0;
        for (const auto& l : layers) {
          if (!functional && l->class_name() == "InputLayer") continue;
          if (!l->weights().empty())
            out.emplace_back(str_cat("layer_with_weights-", j++), Trackable(*l));
          out.emplace_back(str_cat("layer-", i++), Trackable(*l));
        }
      } else {
        const auto& attributes = model->layer_attributes();
        for (size_t k = 0; k < layers.size(); ++k)
          out.emplace_back(attributes[k], Trackable(*layers[k]));
      }
      for (const auto& l : layers) {
        if (!l->built() && l->class_name() != "InputLayer") unbuilt.layers.push_back(l->name());
      }
      if (!unbuilt.layers.empty()) this->unbuilt.push_back(std::move(unbuilt));
      break;
    }
    case Trackable::Kind::kOptimizer: {
      auto* opt = static_cast<optim::Optimizer*>(t.ptr_);
      out.emplace_back("iter", Trackable(opt->iterations_variable()));
      break;
    }
    case Trackable::Kind::kObject:
      out = t.extra_->children;
      break;
    default:
      break;
  }
  return out;
}

void GraphView::add_value(int node, const std::string& path, std::string_view attribute,
                          std::string full_name, std::function<Tensor()> get,
                          std::function<void(const Tensor&)> set) {
  SavedValue v;
  v.key = path + "/" + std::string(kObjectAttributesName) + "/" + escape_local_name(attribute);
  v.full_name = std::move(full_name);
  v.get = std::move(get);
  v.set = std::move(set);
  graph.nodes[static_cast<size_t>(node)].attributes.push_back(
      {std::string(attribute), v.full_name, v.key});
  values.push_back(std::move(v));
}

void GraphView::add_values(const Trackable& t, int node, const std::string& path) {
  switch (t.kind_) {
    case Trackable::Kind::kVariable: {
      auto* var = static_cast<Variable*>(t.ptr_);
      add_value(
          node, path, kVariableValueAttribute, var->name(), [var] { return var->tensor(); },
          [var](const Tensor& v) { var->assign(v); });
      values.back().variable = var;
      values.back().adopt = [var](Tensor& restored) {
        Tensor& current = var->tensor();
        // A view or another handle of the variable's buffer must see the restored values.
        if (current.use_count() != 1 || restored.use_count() != 1) return false;
        current = std::move(restored);
        return true;
      };
      break;
    }
    case Trackable::Kind::kCounter: {
      auto* c = static_cast<int64_t*>(t.ptr_);
      add_value(
          node, path, kVariableValueAttribute, path,
          [c] { return Tensor::from_vector<int64_t>({*c}, Shape{}); },
          [c](const Tensor& v) { *c = v.data<int64_t>()[0]; });
      break;
    }
    case Trackable::Kind::kRngState:
    case Trackable::Kind::kPhilox: {
      std::function<RngState()> get_state;
      std::function<void(RngState)> set_state;
      if (t.kind_ == Trackable::Kind::kRngState) {
        auto* s = static_cast<RngState*>(t.ptr_);
        get_state = [s] { return *s; };
        set_state = [s](RngState v) { *s = v; };
      } else {
        auto* p = static_cast<Philox*>(t.ptr_);
        get_state = [p] { return p->state(); };
        set_state = [p](RngState v) { p->set_state(v); };
      }
      add_value(
          node, path, "RNG_STATE", path,
          [get_state] {
            const RngState s = get_state();
            return int64_pair(std::bit_cast<int64_t>(s.seed), std::bit_cast<int64_t>(s.counter));
          },
          [set_state](const Tensor& v) {
            const int64_t* p = v.data<int64_t>();
            set_state(RngState{std::bit_cast<uint64_t>(p[0]), std::bit_cast<uint64_t>(p[1])});
          });
      break;
    }
    case Trackable::Kind::kIteratorState: {
      auto* s = static_cast<data::IteratorState*>(t.ptr_);
      add_value(
          node, path, "ITERATOR_STATE", path, [s] { return int64_pair(s->iteration, s->position); },
          [s](const Tensor& v) {
            *s = data::IteratorState{v.data<int64_t>()[0], v.data<int64_t>()[1]};
          });
      break;
    }
    case Trackable::Kind::kIterator: {
      auto* it = static_cast<data::Iterator*>(t.ptr_);
      const data::Dataset* ds = t.extra_->dataset;
      add_value(
          node, path, "ITERATOR_STATE", path,
          [it] {
            const data::IteratorState s = it->state();
            return int64_pair(s.iteration, s.position);
          },
          [it, ds](const Tensor& v) {
            *it =
                ds->iterator_from(data::IteratorState{v.data<int64_t>()[0], v.data<int64_t>()[1]});
          });
      break;
    }
    case Trackable::Kind::kValue:
      add_value(node, path, kVariableValueAttribute, path, t.extra_->get, t.extra_->set);
      break;
    default:
      break;
  }
}

GraphView GraphView::build(const Trackable* root,
                           const std::vector<std::pair<std::string, Trackable>>& root_children) {
  GraphView view;
  std::vector<std::optional<Trackable>> sources;  // per node; nullopt for a synthetic root
  std::vector<std::string> paths;
  std::map<std::pair<int, const void*>, int> ids;
  auto new_node = [&](std::optional<Trackable> t, std::string path) {
    const int id = static_cast<int>(view.graph.nodes.size());
    view.graph.nodes.emplace_back();
    if (t) ids[{static_cast<int>(t->kind_), t->identity()}] = id;
    sources.push_back(std::move(t));
    paths.push_back(std::move(path));
    return id;
  };
  new_node(root ? std::optional<Trackable>(*root) : std::nullopt, "");

  std::deque<int> queue{0};
  while (!queue.empty()) {
    const int n = queue.front();
    queue.pop_front();
    const std::string path = paths[static_cast<size_t>(n)];
    std::vector<std::pair<std::string, Trackable>> children;
    if (sources[static_cast<size_t>(n)]) {
      children = view.children_of(*sources[static_cast<size_t>(n)], path);
    }
    if (n == 0) children.insert(children.end(), root_children.begin(), root_children.end());
    std::set<std::string> names;
    for (auto& [name, child] : children) {
      DTRAIN_CHECK(!name.empty(), "Checkpoint: an object at '", path,
                   "' has a child with an empty name");
      DTRAIN_CHECK(names.insert(name).second, "Checkpoint: two children of '",
                   path.empty() ? "<root>" : path, "' are named '", name, "'");
      auto found = ids.find({static_cast<int>(child.kind_), child.identity()});
      int id;
      if (found != ids.end()) {
        id = found->second;
      } else {
        id = new_node(child, child_path(path, name));
        queue.push_back(id);
      }
      view.graph.nodes[static_cast<size_t>(n)].children.push_back({id, name});
    }
  }
  const int bfs_nodes = static_cast<int>(view.graph.nodes.size());
  for (int n = 0; n < bfs_nodes; ++n) {
    if (sources[static_cast<size_t>(n)])
      view.add_values(*sources[static_cast<size_t>(n)], n, paths[static_cast<size_t>(n)]);
  }
  // Slot variables come after the breadth-first nodes, as in TF.
  for (int o = 0; o < bfs_nodes; ++o) {
    const auto& src = sources[static_cast<size_t>(o)];
    if (!src || src->kind_ != Trackable::Kind::kOptimizer) continue;
    auto* opt = static_cast<optim::Optimizer*>(src->ptr_);
    const std::vector<std::string> slot_names = opt->slot_names();
    for (int v = 0; v < bfs_nodes; ++v) {
      const auto& vs = sources[static_cast<size_t>(v)];
      if (!vs || vs->kind_ != Trackable::Kind::kVariable) continue;
      auto* var = static_cast<Variable*>(vs->ptr_);
      if (var->dtype() != DType::kFloat32 || var == &opt->iterations_variable()) continue;
      for (size_t s = 0; s < slot_names.size(); ++s) {
        const std::string slot_path =
            paths[static_cast<size_t>(v)] + "/" + std::string(kOptimizerSlotName) + "/" +
            paths[static_cast<size_t>(o)] + "/" + escape_local_name(slot_names[s]);
        Variable* slot = opt->slot(*var, slot_names[s]);
        if (slot == nullptr) {
          if (s == 0) {
            view.potential_slots.push_back({opt, var,
                                            slot_path + "/" + std::string(kObjectAttributesName) +
                                                "/" + std::string(kVariableValueAttribute)});
          }
          continue;
        }
        const int id = static_cast<int>(view.graph.nodes.size());
        view.graph.nodes.emplace_back();
        view.add_values(Trackable(*slot), id, slot_path);
        view.values.back().slot_of = var;
        view.values.back().slot = slot_names[s];
        // The optimizer keeps pointers to its slots' data (Optimizer::SlotSet): copied into.
        view.values.back().adopt = nullptr;
        view.graph.nodes[static_cast<size_t>(o)].slot_variables.push_back({v, slot_names[s], id});
      }
    }
  }
  return view;
}

}  // namespace dtrain::checkpoint::detail
