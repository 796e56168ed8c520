// The launcher's exclusion policy: a worker slot (one node) or a node (several) that fails
// --exclude-after times within --exclude-window sits out the following generations. Private to
// src/fault. Pure; not thread-safe.
#pragma once

#include <set>
#include <string>
#include <vector>

#include "dtrain/fault/launch_agent.h"
#include "fault/failure_classifier.h"

namespace dtrain::fault {

class ExclusionPolicy {
 public:
  // `slots` worker slots on this node; `multi_node`: the job spans several nodes (nodes are
  // excluded, not slots); `threshold` failures within `window_s` seconds exclude (0: never).
  ExclusionPolicy(int slots, bool multi_node, int threshold, double window_s);

  // The slots not excluded, in order.
  std::vector<int> active_slots() const;
  int slots_left() const { return slots_ - static_cast<int>(excluded_slots_.size()); }
  bool every_slot_excluded() const { return slots_left() == 0; }

  // Single node: records failure `f` of one of this node's slots (not an admission); returns
  // true when its slot is now excluded.
  bool exclude_slot(const Failure& f);
  // Several nodes: records the generation's first failure `f`, seen by node `node` as its own
  // (not an admission or a preemption); returns true when `node` should now leave the job.
  bool exclude_node(const Failure& f, int node);

  // "slot 1 failed 2 times within 600 s: excluded (1 slot(s) left)".
  std::string slot_message(int slot) const;
  // "node 1 failed 2 times within 600 s: excluded from the job".
  std::string node_message(int node) const;

 private:
  int slots_;
  bool multi_node_;
  int threshold_;
  double window_s_;
  FailureHistory slot_history_;
  FailureHistory node_history_;
  std::set<int> excluded_slots_;
};

}  // namespace dtrain::fault
