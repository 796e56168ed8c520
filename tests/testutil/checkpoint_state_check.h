// Test helper for readers that poll a checkpoint state file while saves run: what they may see.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "checkpoint/checkpoint_state.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

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

// Reads `<dir>/checkpoint` over and over on a thread until stop(): every state it reads must
// list consecutive "ckpt-N" checkpoints (at most `max_listed`), newest last, moving forward, and
// satisfy `also` when given. Counts the reads and the bad states and keeps the first bad text.
class StateFilePoller {
 public:
  StateFilePoller(std::string dir, size_t max_listed,
                  std::function<bool(const checkpoint::CheckpointState&)> also = nullptr)
      : dir_(std::move(dir)), thread_([this, max_listed, also = std::move(also)] {
          int64_t newest = 0;
          while (!done_.load()) {
            std::string text;
            try {
              text = read_file(dir_ + "/checkpoint");
            } catch (const NotFoundError&) {
              std::this_thread::yield();
              continue;
            }
            ++polls_;
            const auto st = checkpoint::parse_checkpoint_state(text, "state");
            const bool ok = lists_consecutive_moving_forward(st, "ckpt", max_listed, newest) &&
                            (!also || also(st));
            if (!ok && bad_++ == 0) first_bad_ = text;
          }
        }) {}
  ~StateFilePoller() { stop(); }
  StateFilePoller(const StateFilePoller&) = delete;
  StateFilePoller& operator=(const StateFilePoller&) = delete;

  // Stops polling and waits for the thread; the counts are final afterwards.
  void stop() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int polls() const { return polls_.load(); }
  int bad() const { return bad_.load(); }
  const std::string& first_bad() const { return first_bad_; }  // after stop()

 private:
  std::string dir_;
  std::atomic<bool> done_{false};
  std::atomic<int> polls_{0}, bad_{0};
  std::string first_bad_;
  std::thread thread_;  // last: starts once the fields above exist
};

}  // namespace dtrain::testutil
