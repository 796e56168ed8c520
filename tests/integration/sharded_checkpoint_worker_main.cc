// A worker of the sharded-checkpoint tests: under MultiWorkerMirroredStrategy (cluster from
// TF_CONFIG; without one, a single worker) it brings ShardedState (sharded_checkpoint_model.h)
// to step 1, saves `<dir>/ckpt` sharded, then for each further save advances one step and saves
// again. --plain writes unsharded checkpoints instead (the reference). --kill-rank R --kill-at
// P makes worker R SIGKILL itself during the last save: "rows" while writing its shard (after
// its first partitioned rows), "start" / "entries" / "done" just before the save's first,
// second or third all-gather.
//   sharded_checkpoint_worker --dir D [--saves K] [--plain] [--kill-rank R --kill-at P]
//                             [--timeout-ms T]
// Exit status 0, or 1 with "error: ..." on stderr.
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "dtrain/core/error.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "dtrain/train/sharded_checkpoints.h"
#include "sharded_checkpoint_model.h"

using namespace dtrain;

namespace {

// Rows of the full tensors (as the default), with the "rows" kill point.
class KillingRows : public checkpoint::RowSource {
 public:
  KillingRows(testing::ShardedState& state, bool armed) : state_(state), armed_(armed) {}
  bool armed_for_this_save = false;
  Tensor rows(const Variable& variable, const std::string& slot, int64_t b, int64_t e) override {
    if (armed_ && armed_for_this_save && ++calls_ == 2) raise(SIGKILL);
    Variable* v = const_cast<Variable*>(&variable);
    const Tensor full = slot.empty() ? v->tensor() : state_.opt.slot(*v, slot)->tensor();
    Shape shape = full.shape();
    const size_t row_bytes = full.nbytes() / static_cast<size_t>(shape[0]);
    shape[0] = e - b;
    Tensor out(full.dtype(), shape);
    std::memcpy(out.raw_data(),
                static_cast<const char*>(full.raw_data()) + static_cast<size_t>(b) * row_bytes,
                out.nbytes());
    return out;
  }

 private:
  testing::ShardedState& state_;
  bool armed_;
  int calls_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir, kill_at;
  int saves = 1, kill_rank = -1;
  int64_t timeout_ms = 20000;
  bool plain = false;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    const std::string v = i + 1 < argc ? argv[i + 1] : "";
    if (k == "--plain") {
      plain = true;
      continue;
    }
    ++i;
    if (k == "--dir")
      dir = v;
    else if (k == "--saves")
      saves = std::atoi(v.c_str());
    else if (k == "--kill-rank")
      kill_rank = std::atoi(v.c_str());
    else if (k == "--kill-at")
      kill_at = v;
    else if (k == "--timeout-ms")
      timeout_ms = std::atoll(v.c_str());
    else {
      std::fprintf(stderr, "usage: unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  try {
    std::unique_ptr<distribute::MultiWorkerMirroredStrategy> strategy;
    if (!plain) {
      strategy = std::make_unique<distribute::MultiWorkerMirroredStrategy>(
          distribute::MultiWorkerOptions{.timeout = std::chrono::milliseconds(timeout_ms)});
    }
    testing::ShardedState state;
    state.advance_to(1);
    checkpoint::Checkpoint ckpt(state.trackables());
    const bool armed = strategy && strategy->worker_rank() == kill_rank;
    KillingRows rows(state, armed && kill_at == "rows");
    int gathers = 0;
    bool last_save = false;
    if (strategy) {
      checkpoint::ShardedSaveOptions options =
          train::sharded_save_options(*strategy, state.model, &rows);
      options.all_gather = [&](const std::string& mine) {
        ++gathers;
        if (armed && last_save &&
            ((kill_at == "start" && gathers == 1) || (kill_at == "entries" && gathers == 2) ||
             (kill_at == "done" && gathers == 3))) {
          raise(SIGKILL);
        }
        return train::all_gather_bytes(*strategy, mine);
      };
      ckpt.set_sharding(std::move(options));
    }
    for (int s = 1; s <= saves; ++s) {
      if (s > 1) state.advance_to(s);
      last_save = s == saves;
      rows.armed_for_this_save = last_save;
      gathers = 0;
      ckpt.save(dir + "/ckpt");
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
