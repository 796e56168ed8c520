// The exclusion policy (see exclusion_policy.h) and the failure window behind it.
#include "fault/exclusion_policy.h"

#include "dtrain/core/error.h"

namespace dtrain::fault {

bool FailureHistory::record(int id, Clock::time_point at) {
  failures_[id].push_back(at);
  return threshold_ > 0 && count(id, at) >= threshold_;
}

int FailureHistory::count(int id, Clock::time_point at) {
  auto& q = failures_[id];
  while (!q.empty() && q.front() + window_ < at) q.pop_front();
  return static_cast<int>(q.size());
}

ExclusionPolicy::ExclusionPolicy(int slots, bool multi_node, int threshold, double window_s)
    : slots_(slots),
      multi_node_(multi_node),
      threshold_(threshold),
      window_s_(window_s),
      slot_history_(threshold, ms_of(window_s)),
      node_history_(threshold, ms_of(window_s)) {}

std::vector<int> ExclusionPolicy::active_slots() const {
  std::vector<int> out;
  for (int s = 0; s < slots_; ++s) {
    if (excluded_slots_.count(s) == 0) out.push_back(s);
  }
  return out;
}

bool ExclusionPolicy::exclude_slot(const Failure& f) {
  if (!f.ours || f.admit || multi_node_ || !f.slot) return false;
  if (!slot_history_.record(*f.slot, f.detected_at)) return false;
  excluded_slots_.insert(*f.slot);
  return true;
}

bool ExclusionPolicy::exclude_node(const Failure& f, int node) {
  if (!f.ours || f.admit || f.preemption || threshold_ <= 0 || !multi_node_) return false;
  return node_history_.record(node, f.detected_at);
}

std::string ExclusionPolicy::slot_message(int slot) const {
  return str_cat("slot ", slot, " failed ", threshold_, " times within ", window_s_,
                 " s: excluded (", slots_left(), " slot(s) left)");
}

std::string ExclusionPolicy::node_message(int node) const {
  return str_cat("node ", node, " failed ", threshold_, " times within ", window_s_,
                 " s: excluded from the job");
}

}  // namespace dtrain::fault
