// The step observer: a shared_ptr swapped under a mutex, read by fit() once per step.
#include "dtrain/train/step_observer.h"

#include <memory>
#include <mutex>

namespace dtrain::train {
namespace {
std::mutex g_mu;
std::shared_ptr<const std::function<void(int64_t)>> g_observer;  // guarded by g_mu
}  // namespace

void set_step_observer(std::function<void(int64_t)> observer) {
  auto p = observer ? std::make_shared<const std::function<void(int64_t)>>(std::move(observer))
                    : nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  g_observer = std::move(p);
}

void notify_step(int64_t global_step) {
  std::shared_ptr<const std::function<void(int64_t)>> o;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_observer) return;
    o = g_observer;
  }
  (*o)(global_step);
}

}  // namespace dtrain::train
