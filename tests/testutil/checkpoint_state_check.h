// Test helper for readers that poll a checkpoint state file while saves run: what they may see.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/checkpoint_state.h"

namespace dtrain::testutil {

// Whether `st` lists consecutive checkpoints "<name>-<first>" ... "<name>-<last>" (at most
// `max_listed` of them), names the last as the newest, and does not go back behind `newest`, the
// last one seen before (updated when it holds).
inline bool lists_consecutive_moving_forward(const checkpoint::CheckpointState& st,
                                             const std::string& name, size_t max_listed,
                                             int64_t& newest) {
  const auto& ps = st.all_model_checkpoint_paths;
  if (ps.empty() || ps.size() > max_listed || st.model_checkpoint_path != ps.back()) return false;
  const std::string prefix = name + "-";
  if (ps[0].compare(0, prefix.size(), prefix) != 0) return false;
  const int64_t first = std::stoll(ps[0].substr(prefix.size()));
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i] != prefix + std::to_string(first + static_cast<int64_t>(i))) return false;
  }
  const int64_t last = first + static_cast<int64_t>(ps.size()) - 1;
  if (last < newest) return false;
  newest = last;
  return true;
}

}  // namespace dtrain::testutil
