// TF2's TrackableObjectGraph proto (tensorflow/core/protobuf/trackable_object_graph.proto), as
// stored in a checkpoint's `_CHECKPOINTABLE_OBJECT_GRAPH` string tensor, and the key-escaping
// rules of tensorflow/python/trackable/trackable_utils.py. Value types; thread-compatible.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dtrain::checkpoint {

struct ObjectGraph {
  struct Child {  // ObjectReference
    int node_id = 0;
    std::string local_name;
  };
  struct Attribute {             // SerializedTensor
    std::string name;            // "VARIABLE_VALUE"
    std::string full_name;       // TF1-style variable name, e.g. "sequential/dense/kernel"
    std::string checkpoint_key;  // the bundle key
  };
  struct SlotVariable {  // SlotVariableReference
    int original_variable_node_id = 0;
    std::string slot_name;
    int slot_variable_node_id = 0;
  };
  struct Node {  // TrackableObject
    std::vector<Child> children;
    std::vector<Attribute> attributes;
    std::vector<SlotVariable> slot_variables;
  };
  std::vector<Node> nodes;  // node 0 is the root

  // The serialized proto, fields in field-number order (as TF writes it).
  std::string serialize() const;
  // Parses a serialized proto, skipping fields dtrain does not use (registered savers,
  // has_checkpoint_values). Throws DataLossError naming `what` when malformed or when a
  // reference points outside the node list.
  static ObjectGraph parse(std::string_view bytes, const std::string& what);
};

// escape(): '.' → "..", '/' → ".S" (trackable_utils.escape_local_name).
std::string escape_local_name(std::string_view name);

inline constexpr std::string_view kObjectAttributesName = ".ATTRIBUTES";
inline constexpr std::string_view kOptimizerSlotName = ".OPTIMIZER_SLOT";
inline constexpr std::string_view kVariableValueAttribute = "VARIABLE_VALUE";

}  // namespace dtrain::checkpoint
