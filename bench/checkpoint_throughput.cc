// Checkpoint save/restore throughput for about 1 GiB of float32 variables (issue 3), the dtrain
// side of bench/checkpoint_throughput.sh: synchronous save (Checkpoint::write, fsynced and
// renamed), the time an async save blocks the caller and its total, restore, and the memcpy of
// the variables into fresh and into pre-faulted buffers (the bound for an async save's blocking
// time). Prints "key value" lines (medians over the repeats, and every repeat). Single-threaded
// caller; the async save adds the checkpoint's writer thread.
//
// Usage: bench_checkpoint_throughput DIR [total_mib=1024] [tensors=16] [repeats=3]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/autograd/variable.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/core/random.h"

using namespace dtrain;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void remove_checkpoint(const std::string& prefix) {
  std::error_code ec;
  const fs::path p(prefix);
  for (const auto& e : fs::directory_iterator(p.parent_path(), ec)) {
    if (e.path().filename().string().rfind(p.filename().string() + ".", 0) == 0) {
      fs::remove(e.path(), ec);
    }
  }
}

void print_series(const char* key, const std::vector<double>& v) {
  std::printf("%s %.4f\n", key, median(v));
  std::printf("%s_all", key);
  for (double x : v) std::printf(" %.4f", x);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DIR [total_mib=1024] [tensors=16] [repeats=3]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const int64_t total_mib = argc > 2 ? std::atoll(argv[2]) : 1024;
  const int64_t n_tensors = argc > 3 ? std::atoll(argv[3]) : 16;
  const int repeats = argc > 4 ? std::atoi(argv[4]) : 3;
  const int64_t floats_each = total_mib * (int64_t{1} << 20) / 4 / n_tensors;

  // Variables of random values (incompressible, like trained weights), each [floats_each / 1024,
  // 1024] so that they look like layer kernels.
  Philox rng(0);
  std::vector<std::unique_ptr<Variable>> vars;
  std::vector<std::pair<std::string, checkpoint::Trackable>> children;
  for (int64_t i = 0; i < n_tensors; ++i) {
    Tensor t(Shape{floats_each / 1024, 1024});
    float* p = t.data<float>();
    for (int64_t j = 0; j < t.num_elements(); ++j) p[j] = rng.uniform(-1, 1);
    vars.push_back(std::make_unique<Variable>("v" + std::to_string(i), t));
  }
  for (int64_t i = 0; i < n_tensors; ++i) children.emplace_back("v" + std::to_string(i), *vars[i]);
  uint64_t bytes = 0;
  for (const auto& v : vars) bytes += v->tensor().nbytes();

  const std::string prefix = dir + "/dtrain_bench_ckpt";
  std::vector<double> memcpy_fresh, memcpy_warm, save_sync, save_nosync, async_block, async_total,
      restore;
  std::vector<Tensor> warm;
  for (const auto& v : vars) warm.push_back(v->tensor().clone());
  for (int r = 0; r < repeats; ++r) {
    {  // What an async save's snapshot costs at least: one copy of every variable.
      auto t0 = Clock::now();
      std::vector<Tensor> copies;
      for (const auto& v : vars) copies.push_back(v->tensor().clone());
      memcpy_fresh.push_back(seconds_since(t0));
      t0 = Clock::now();
      for (size_t i = 0; i < vars.size(); ++i) {
        std::memcpy(warm[i].raw_data(), vars[i]->tensor().raw_data(), warm[i].nbytes());
      }
      memcpy_warm.push_back(seconds_since(t0));
    }
    {
      checkpoint::Checkpoint ckpt(children);
      remove_checkpoint(prefix);
      auto t0 = Clock::now();
      ckpt.write(prefix);
      save_sync.push_back(seconds_since(t0));
      t0 = Clock::now();
      ckpt.restore(prefix).assert_consumed();
      restore.push_back(seconds_since(t0));
    }
    {
      checkpoint::Checkpoint ckpt(children, {.sync_to_disk = false});
      remove_checkpoint(prefix);
      const auto t0 = Clock::now();
      ckpt.write(prefix);
      save_nosync.push_back(seconds_since(t0));
    }
    {
      checkpoint::Checkpoint ckpt(children, {.enable_async = true});
      remove_checkpoint(prefix);
      const auto t0 = Clock::now();
      ckpt.write(prefix);
      async_block.push_back(seconds_since(t0));
      ckpt.sync();
      async_total.push_back(seconds_since(t0));
    }
    remove_checkpoint(prefix);
  }
  std::printf("tensors %lld\n", static_cast<long long>(n_tensors));
  std::printf("bytes %llu\n", static_cast<unsigned long long>(bytes));
  print_series("memcpy_fresh_seconds", memcpy_fresh);
  print_series("memcpy_prefaulted_seconds", memcpy_warm);
  print_series("save_sync_seconds", save_sync);
  print_series("save_nosync_seconds", save_nosync);
  print_series("async_save_blocking_seconds", async_block);
  print_series("async_save_total_seconds", async_total);
  print_series("restore_seconds", restore);
  return 0;
}
