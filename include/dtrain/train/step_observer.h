// A process-wide hook that fit() calls after every training step with the global step number,
// so that layers above train (the fault layer's progress reporter for the launcher's watchdog)
// can observe progress without train depending on them. The observer must be cheap and must
// not block or throw. Thread-safe: set_step_observer may race with fit(); the observer is called
// on the thread that runs fit().
#pragma once

#include <cstdint>
#include <functional>

namespace dtrain::train {

// Replaces the observer (an empty function removes it).
void set_step_observer(std::function<void(int64_t global_step)> observer);
// Calls the observer, if any, with `global_step`.
void notify_step(int64_t global_step);

}  // namespace dtrain::train
