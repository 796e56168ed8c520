// The object-graph view (private to the checkpoint layer): the trackable objects reachable from
// a checkpoint's root, breadth-first as TF's ObjectGraphView walks them, with the key of every
// value they save (docs/checkpoints.md has the key scheme). Built anew for every save, restore
// and keys(); thread-compatible.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "object_graph.h"

namespace dtrain::checkpoint::detail {

struct TrackableExtra {
  const data::Dataset* dataset = nullptr;
  std::function<Tensor()> get;
  std::function<void(const Tensor&)> set;
  std::vector<std::pair<std::string, Trackable>> children;
};

// One value a checkpoint saves: a node's attribute.
struct SavedValue {
  std::string key;        // object-based checkpoint key
  std::string full_name;  // TF1-style name, for name-based restore
  std::function<Tensor()> get;
  std::function<void(const Tensor&)> set;
  // A variable's value (null otherwise): takes a restored tensor's buffer instead of copying it,
  // when no other handle or view shares either buffer; false when it did not (then call set).
  std::function<bool(Tensor&)> adopt;
  bool optional = false;               // save_counter: its absence is not "missing"
  const Variable* variable = nullptr;  // the variable saved (a Variable trackable or a slot)
  const Variable* slot_of = nullptr;   // a slot: the variable it belongs to
  std::string slot;                    // a slot: its name
};

// The object graph reachable from a root, with the values of its nodes.
struct GraphView {
  struct PotentialSlot {  // a slot an optimizer has not created yet
    optim::Optimizer* optimizer;
    Variable* variable;
    std::string key;  // the key its first slot would have
  };
  struct UnbuiltModel {
    std::string path;
    std::vector<std::string> layers;
  };

  ObjectGraph graph;
  std::vector<SavedValue> values;
  std::vector<PotentialSlot> potential_slots;
  std::vector<UnbuiltModel> unbuilt;

  static GraphView build(const Trackable* root,
                         const std::vector<std::pair<std::string, Trackable>>& root_children);

 private:
  std::vector<std::pair<std::string, Trackable>> children_of(const Trackable& t,
                                                             const std::string& path);
  void add_values(const Trackable& t, int node, const std::string& path);
  void add_value(int node, const std::string& path, std::string_view attribute,
                 std::string full_name, std::function<Tensor()> get,
                 std::function<void(const Tensor&)> set);
};

}  // namespace dtrain::checkpoint::detail
