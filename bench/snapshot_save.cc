// What one in-memory snapshot costs in CPU time (issue 15, "snapshot overhead <= 1 % of step
// time at one snapshot per 10 steps"), the two ways a worker has written them: the async
// CheckpointManager path (clone on the calling thread, a writer thread writing a new tmpfs bundle,
// committing and deleting the dropped one; what memory_snapshots used before) and SnapshotSlots
// (one copy with its CRC into a reused, pre-mapped tmpfs slot, then index and state file;
// src/train/snapshot_slots.h). The state is the MLP's (784-128-10 with Adam's two slots: 1.22 MB
// in 12 tensors) or, with a size argument, one of that many bytes. Between snapshots every value
// is updated in place (as a training step does, leaving it in the cache). Prints "key value"
// lines: per snapshot, the process's CPU time (user + system, every thread) above the updates'
// alone, and the calling thread's wall time.
//
// Usage: bench_snapshot_save DIR(on tmpfs) [snapshots=500] [state_bytes=0: the MLP's]
//        [ways=both|slots: slots skips the CheckpointManager path, e.g. for a profile]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/checkpoint_manager.h"
#include "train/snapshot_slots.h"

using namespace dtrain;
namespace fs = std::filesystem;

namespace {

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct State {
  std::vector<std::unique_ptr<Variable>> vars;
  explicit State(int64_t bytes) {
    std::vector<Shape> shapes;
    if (bytes <= 0) {
      for (const Shape& s : {Shape{784, 128}, Shape{128}, Shape{128, 10}, Shape{10}}) {
        for (int copy = 0; copy < 3; ++copy) shapes.push_back(s);  // value, m, v
      }
    } else {
      shapes.push_back(Shape{bytes / 4});
    }
    for (size_t i = 0; i < shapes.size(); ++i) {
      vars.push_back(
          std::make_unique<Variable>("v" + std::to_string(i), Tensor::full(shapes[i], 0.5)));
    }
  }
  std::vector<std::pair<std::string, checkpoint::Trackable>> children() {
    std::vector<std::pair<std::string, checkpoint::Trackable>> out;
    for (auto& v : vars) out.emplace_back(v->name(), *v);
    return out;
  }
  void update() {
    for (auto& v : vars) {
      float* p = v->tensor().data<float>();
      for (int64_t i = 0, n = v->tensor().num_elements(); i < n; ++i) p[i] = p[i] * 0.999f + 1e-3f;
    }
  }
};

// Runs `n` updates, with a snapshot after each when `save` is set; returns {cpu, wall of the
// snapshots on the calling thread}.
template <typename Save>
std::pair<double, double> run(State& s, int n, Save save) {
  const double c0 = cpu_seconds();
  double in_save = 0;
  for (int i = 1; i <= n; ++i) {
    s.update();
    const double t0 = wall_seconds();
    save(i);
    in_save += wall_seconds() - t0;
  }
  return {cpu_seconds() - c0, in_save};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [snapshots=500] [state_bytes=0] [ways=both|slots]\n",
                 argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int n = argc > 2 ? std::atoi(argv[2]) : 500;
  const int64_t bytes = argc > 3 ? std::atoll(argv[3]) : 0;
  const bool both = argc <= 4 || std::string(argv[4]) != "slots";
  State s(bytes);
  int64_t total = 0;
  for (auto& v : s.vars) total += static_cast<int64_t>(v->tensor().nbytes());
  std::printf("state_bytes %lld\ntensors %zu\nsnapshots %d\n", static_cast<long long>(total),
              s.vars.size(), n);
  fs::remove_all(dir);
  for (int round = 0; round < 3; ++round) {
    // The updates alone, then each writer; three rounds, interleaved.
    const auto [base_cpu, base_wall] = run(s, n, [](int) {});
    (void)base_wall;
    double old_cpu = 0, old_wall = 0;
    if (both) {
      checkpoint::Checkpoint ckpt(
          s.children(), {.enable_async = true, .sync_to_disk = false, .max_in_flight = 2});
      checkpoint::CheckpointManager manager(
          ckpt, dir + "/old",
          {.max_to_keep = 6, .checkpoint_name = "snap", .recycle_files = false});
      const double c0 = cpu_seconds();
      std::tie(old_cpu, old_wall) = run(s, n, [&](int i) { manager.save(i, false); });
      manager.sync();
      old_cpu = cpu_seconds() - c0;
    }
    double new_cpu = 0, new_wall = 0;
    {
      checkpoint::Checkpoint ckpt(s.children());
      train::SnapshotSlots slots(dir + "/new", ckpt, {.max_to_keep = 6});
      std::tie(new_cpu, new_wall) = run(s, n, [&](int i) { slots.save(i); });
      std::printf("new_slots_created %lld\n", static_cast<long long>(slots.slots_created()));
    }
    std::printf("round %d\n", round + 1);
    std::printf("old_cpu_us_per_snapshot %.1f\nold_caller_wall_us_per_snapshot %.1f\n",
                1e6 * (old_cpu - base_cpu) / n, 1e6 * old_wall / n);
    std::printf("new_cpu_us_per_snapshot %.1f\nnew_caller_wall_us_per_snapshot %.1f\n",
                1e6 * (new_cpu - base_cpu) / n, 1e6 * new_wall / n);
    fs::remove_all(dir);
  }
  return 0;
}
