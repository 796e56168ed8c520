// CheckpointLoadStatus: TF's assertions over what a restore matched.
#include "load_status.h"

#include "checkpoint_state.h"
#include "dtrain/core/error.h"

namespace dtrain::checkpoint {

namespace detail {

std::string join_keys(const std::vector<std::string>& keys, size_t max) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < max; ++i) out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > max) out += str_cat(", ... (", keys.size() - max, " more)");
  return out + "]";
}

}  // namespace detail

using detail::join_keys;

CheckpointLoadStatus::State::~State() {
  if (!acknowledged && !unused.empty()) {
    warn(str_cat("checkpoint ", path, ": ", unused.size(),
                 " value(s) were not restored into any object: ", join_keys(unused),
                 " (call expect_partial() on the restore status to silence this)"));
  }
}

const CheckpointLoadStatus& CheckpointLoadStatus::assert_consumed() const {
  state_->acknowledged = true;
  if (!state_->unused.empty() || !state_->missing.empty()) {
    std::string msg = str_cat("checkpoint ", state_->path, ": assert_consumed failed:");
    if (!state_->unused.empty()) {
      msg += str_cat(" ", state_->unused.size(),
                     " checkpoint value(s) were not restored into any object: ",
                     join_keys(state_->unused), ";");
    }
    if (!state_->missing.empty()) {
      msg +=
          str_cat(" ", state_->missing.size(),
                  " object value(s) have no value in the checkpoint: ", join_keys(state_->missing));
    }
    throw FailedPreconditionError(msg);
  }
  return *this;
}

const CheckpointLoadStatus& CheckpointLoadStatus::assert_existing_objects_matched() const {
  state_->acknowledged = true;
  if (!state_->missing.empty()) {
    throw FailedPreconditionError(
        str_cat("checkpoint ", state_->path,
                ": assert_existing_objects_matched failed: ", state_->missing.size(),
                " object value(s) have no value in the checkpoint: ", join_keys(state_->missing)));
  }
  return *this;
}

const CheckpointLoadStatus& CheckpointLoadStatus::expect_partial() const {
  state_->acknowledged = true;
  return *this;
}

const std::string& CheckpointLoadStatus::save_path() const { return state_->path; }
const std::vector<std::string>& CheckpointLoadStatus::unused_keys() const { return state_->unused; }
const std::vector<std::string>& CheckpointLoadStatus::missing_keys() const {
  return state_->missing;
}
size_t CheckpointLoadStatus::restored_count() const { return state_->restored; }

}  // namespace dtrain::checkpoint
