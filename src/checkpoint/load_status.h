// What Checkpoint::restore matched (private to the checkpoint layer): the state a
// CheckpointLoadStatus shares between its copies. Thread-compatible.
#pragma once

#include <string>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"

namespace dtrain::checkpoint {

namespace detail {
// "['a', 'b', ... (3 more)]": at most `max` keys, for messages.
std::string join_keys(const std::vector<std::string>& keys, size_t max = 10);
}  // namespace detail

struct CheckpointLoadStatus::State {
  std::string path;
  std::vector<std::string> unused;
  std::vector<std::string> missing;
  size_t restored = 0;
  mutable bool acknowledged = false;
  // Warns about unused values unless acknowledged.
  ~State();
};

}  // namespace dtrain::checkpoint
