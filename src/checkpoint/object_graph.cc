// TrackableObjectGraph encoding and decoding.
#include "object_graph.h"

#include "dtrain/core/error.h"
#include "dtrain/core/proto_wire.h"

namespace dtrain::checkpoint {

std::string escape_local_name(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  for (char c : name) {
    if (c == '.') {
      out += "..";
    } else if (c == '/') {
      out += ".S";
    } else {
      out += c;
    }
  }
  return out;
}

std::string ObjectGraph::serialize() const {
  std::string out, node_bytes, sub;
  for (const Node& n : nodes) {
    node_bytes.clear();
    for (const Child& c : n.children) {
      sub.clear();
      if (c.node_id != 0) wire::put_varint_field(sub, 1, static_cast<uint64_t>(c.node_id));
      if (!c.local_name.empty()) wire::put_bytes_field(sub, 2, c.local_name);
      wire::put_bytes_field(node_bytes, 1, sub);
    }
    for (const Attribute& a : n.attributes) {
      sub.clear();
      if (!a.name.empty()) wire::put_bytes_field(sub, 1, a.name);
      if (!a.full_name.empty()) wire::put_bytes_field(sub, 2, a.full_name);
      if (!a.checkpoint_key.empty()) wire::put_bytes_field(sub, 3, a.checkpoint_key);
      wire::put_bytes_field(node_bytes, 2, sub);
    }
    for (const SlotVariable& s : n.slot_variables) {
      sub.clear();
      if (s.original_variable_node_id != 0) {
        wire::put_varint_field(sub, 1, static_cast<uint64_t>(s.original_variable_node_id));
      }
      if (!s.slot_name.empty()) wire::put_bytes_field(sub, 2, s.slot_name);
      if (s.slot_variable_node_id != 0) {
        wire::put_varint_field(sub, 3, static_cast<uint64_t>(s.slot_variable_node_id));
      }
      wire::put_bytes_field(node_bytes, 3, sub);
    }
    wire::put_bytes_field(out, 1, node_bytes);
  }
  return out;
}

ObjectGraph ObjectGraph::parse(std::string_view bytes, const std::string& what) {
  ObjectGraph g;
  const std::string ctx = "TrackableObjectGraph in " + what;
  wire::Reader r(bytes, ctx);
  wire::Field f;
  while (r.next(f)) {
    if (f.number != 1 || f.type != wire::kLengthDelimited) continue;
    Node& n = g.nodes.emplace_back();
    wire::Reader nr(f.bytes, ctx);
    wire::Field nf;
    while (nr.next(nf)) {
      if (nf.type != wire::kLengthDelimited) continue;
      wire::Reader sr(nf.bytes, ctx);
      wire::Field sf;
      if (nf.number == 1) {
        Child& c = n.children.emplace_back();
        while (sr.next(sf)) {
          if (sf.number == 1) c.node_id = static_cast<int>(sf.value);
          if (sf.number == 2) c.local_name = std::string(sf.bytes);
        }
      } else if (nf.number == 2) {
        Attribute& a = n.attributes.emplace_back();
        while (sr.next(sf)) {
          if (sf.number == 1) a.name = std::string(sf.bytes);
          if (sf.number == 2) a.full_name = std::string(sf.bytes);
          if (sf.number == 3) a.checkpoint_key = std::string(sf.bytes);
        }
      } else if (nf.number == 3) {
        SlotVariable& s = n.slot_variables.emplace_back();
        while (sr.next(sf)) {
          if (sf.number == 1) s.original_variable_node_id = static_cast<int>(sf.value);
          if (sf.number == 2) s.slot_name = std::string(sf.bytes);
          if (sf.number == 3) s.slot_variable_node_id = static_cast<int>(sf.value);
        }
      }
    }
  }
  const int count = static_cast<int>(g.nodes.size());
  auto check = [&](int id) {
    if (id < 0 || id >= count) {
      throw DataLossError(str_cat(ctx, ": reference to node ", id, " of ", count));
    }
  };
  for (const Node& n : g.nodes) {
    for (const Child& c : n.children) check(c.node_id);
    for (const SlotVariable& s : n.slot_variables) {
      check(s.original_variable_node_id);
      check(s.slot_variable_node_id);
    }
  }
  return g;
}

}  // namespace dtrain::checkpoint
