// The step observer: a shared_ptr swapped under a mutex, read by fit() once per step.
#include "dtrain/train/step_observer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>
#include <string>

namespace dtrain::train {
namespace {
std::mutex g_mu;
std::shared_ptr<const std::function<void(int64_t)>> g_observer;  // guarded by g_mu
std::shared_ptr<const ResumeObserver> g_resume_observer;         // guarded by g_mu

// DTRAIN_STEP_TIMES: the lines not written yet, written in blocks and at exit.
class StepTimes {
 public:
  static StepTimes* instance() {
    static StepTimes* t = [] {
      const char* path = std::getenv("DTRAIN_STEP_TIMES");
      return path != nullptr && *path != '\0' ? new StepTimes(path) : nullptr;
    }();
    return t;
  }
  void add(int64_t step) {
    timespec ts{};
    ::clock_gettime(CLOCK_REALTIME, &ts);
    char line[80];
    const int n =
        std::snprintf(line, sizeof line, "%d %lld %lld.%09ld\n", static_cast<int>(::getpid()),
                      static_cast<long long>(step), static_cast<long long>(ts.tv_sec), ts.tv_nsec);
    std::lock_guard<std::mutex> lock(mu_);
    pending_.append(line, static_cast<size_t>(n));
    if (++lines_ % 64 == 0) write_locked();
  }

 private:
  explicit StepTimes(std::string path) : path_(std::move(path)) {
    std::atexit([] { instance()->write(); });
  }
  void write() {
    std::lock_guard<std::mutex> lock(mu_);
    write_locked();
  }
  // One append per block: lines of processes sharing the file never interleave within one.
  void write_locked() {
    if (pending_.empty()) return;
    const int fd = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (::write(fd, pending_.data(), pending_.size()) < 0) {
        std::fprintf(stderr, "DTRAIN_STEP_TIMES: cannot append to %s\n", path_.c_str());
      }
      ::close(fd);
    }
    pending_.clear();
  }
  std::string path_;
  std::mutex mu_;
  std::string pending_;
  int64_t lines_ = 0;
};
}  // namespace

void set_step_observer(std::function<void(int64_t)> observer) {
  auto p = observer ? std::make_shared<const std::function<void(int64_t)>>(std::move(observer))
                    : nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  g_observer = std::move(p);
}

void notify_step(int64_t global_step) {
  if (StepTimes* t = StepTimes::instance()) t->add(global_step);
  std::shared_ptr<const std::function<void(int64_t)>> o;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_observer) return;
    o = g_observer;
  }
  (*o)(global_step);
}

void set_resume_observer(ResumeObserver observer) {
  auto p = observer ? std::make_shared<const ResumeObserver>(std::move(observer)) : nullptr;
  std::lock_guard<std::mutex> lock(g_mu);
  g_resume_observer = std::move(p);
}

bool notify_resumed(int64_t generation, int64_t global_step, const std::string& checkpoint) {
  std::shared_ptr<const ResumeObserver> o;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_resume_observer) return false;
    o = g_resume_observer;
  }
  (*o)(generation, global_step, checkpoint);
  return true;
}

}  // namespace dtrain::train
