// Sharded checkpoint save/restore throughput (issue 14), one process per rank: every worker holds
// the same ~1 GiB of float32 variables (a replicated job) and either each writes its partition
// as one shard of a TF-format checkpoint (Checkpoint::set_sharding; the chief merges the index),
// or the chief writes the whole checkpoint alone while the others wait; then every worker restores
// the whole state from each. Times are rank 0's, from a barrier before to a barrier after (so the
// slowest worker counts). bench/sharded_checkpoint_throughput.sh runs it beside dd.
//
//   bench_sharded_checkpoint_throughput --rank R --world-size N --rdzv file:///tmp/dir --dir DIR
//                                       [--mib 1024] [--tensors 16] [--repeats 1]
//                                       [--restore-first sharded|chief]
// Rank 0 prints "key value" lines (medians over the repeats). The first restore of a process
// reads into fresh memory (page faults); the second gets the buffers the first freed from the
// tensor cache, so --restore-first says which restore pays for that; the script alternates it.
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
#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/rendezvous.h"

using namespace dtrain;
using namespace dtrain::distribute;
using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

namespace {

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

// Every worker's string, by rank: the sizes first, then the bytes.
std::vector<std::string> gather_strings(Collectives& c, const std::string& mine) {
  Tensor size = Tensor::from_vector<int64_t>({static_cast<int64_t>(mine.size())}, {1});
  Tensor sizes(DType::kInt64, {c.size(), 1});
  c.all_gather(size, sizes);
  std::vector<size_t> bytes;
  size_t total = 0;
  // Read in place: a to_vector() temporary in the loop made g++ 12 warn -Wfree-nonheap-object.
  const int64_t* per_rank = sizes.data<int64_t>();
  for (int k = 0; k < c.size(); ++k) {
    bytes.push_back(static_cast<size_t>(per_rank[k]));
    total += static_cast<size_t>(per_rank[k]);
  }
  std::string all(total, '\0');
  c.all_gather_v(mine.data(), all.data(), bytes);
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t b : bytes) {
    out.push_back(all.substr(at, b));
    at += b;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0, world = 2, repeats = 1;
  int64_t mib = 1024, n_tensors = 16;
  std::string rdzv, dir, restore_first = "sharded";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--rank") {
      rank = std::atoi(v.c_str());
    } else if (k == "--world-size") {
      world = std::atoi(v.c_str());
    } else if (k == "--rdzv") {
      rdzv = v;
    } else if (k == "--dir") {
      dir = v;
    } else if (k == "--mib") {
      mib = std::atoll(v.c_str());
    } else if (k == "--tensors") {
      n_tensors = std::atoll(v.c_str());
    } else if (k == "--restore-first") {
      restore_first = v;
    } else if (k == "--repeats") {
      repeats = std::atoi(v.c_str());
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  if (rdzv.empty() || dir.empty() || mib < 1 || n_tensors < 1 || repeats < 1 ||
      (restore_first != "sharded" && restore_first != "chief")) {
    std::fprintf(stderr,
                 "usage: %s --rank R --world-size N --rdzv URL --dir DIR [--mib M] "
                 "[--tensors T] [--repeats K] [--restore-first sharded|chief]\n",
                 argv[0]);
    return 2;
  }
  try {
    auto c = Collectives::connect(
        open_store(rdzv),
        {.rank = rank, .world_size = world, .timeout = std::chrono::seconds(300)});
    // The same random values on every worker (incompressible, like trained weights).
    const int64_t floats_each = mib * (int64_t{1} << 20) / 4 / n_tensors;
    Philox rng(0);
    std::vector<std::unique_ptr<Variable>> vars;
    std::vector<std::pair<std::string, checkpoint::Trackable>> children;
    std::vector<const Variable*> partitioned;
    for (int64_t i = 0; i < n_tensors; ++i) {
      Tensor t(Shape{floats_each / 1024, 1024});
      float* p = t.data<float>();
      for (int64_t j = 0; j < t.num_elements(); ++j) p[j] = rng.uniform(-1, 1);
      vars.push_back(std::make_unique<Variable>("v" + std::to_string(i), t));
    }
    uint64_t bytes = 0;
    for (int64_t i = 0; i < n_tensors; ++i) {
      children.emplace_back("v" + std::to_string(i), *vars[i]);
      partitioned.push_back(vars[i].get());
      bytes += vars[i]->tensor().nbytes();
    }
    const std::string sharded = dir + "/sharded_ckpt", chief = dir + "/chief_ckpt";
    std::vector<double> save_sharded, save_chief, restore_sharded, restore_chief;
    auto timed = [&](auto&& fn) {
      c->barrier();
      const auto t0 = Clock::now();
      fn();
      c->barrier();
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };
    for (int r = 0; r < repeats; ++r) {
      if (rank == 0) {
        remove_checkpoint(sharded);
        remove_checkpoint(chief);
      }
      checkpoint::Checkpoint shard_ckpt(children);
      shard_ckpt.set_sharding(checkpoint::ShardedSaveOptions{
          .rank = rank,
          .num_shards = world,
          .partitioned = partitioned,
          .all_gather = [&](const std::string& mine) { return gather_strings(*c, mine); }});
      save_sharded.push_back(timed([&] { shard_ckpt.write(sharded); }));
      checkpoint::Checkpoint plain(children);
      save_chief.push_back(timed([&] {
        if (rank == 0) plain.write(chief);
      }));
      const bool sharded_first = restore_first == "sharded";
      if (!sharded_first) {
        restore_chief.push_back(timed([&] { plain.restore(chief).assert_consumed(); }));
      }
      restore_sharded.push_back(timed([&] { plain.restore(sharded).assert_consumed(); }));
      if (sharded_first) {
        restore_chief.push_back(timed([&] { plain.restore(chief).assert_consumed(); }));
      }
    }
    c->barrier();
    if (rank == 0) {
      remove_checkpoint(sharded);
      remove_checkpoint(chief);
      const double gib = static_cast<double>(bytes) / (1 << 30);
      std::printf("bytes %llu\nworld_size %d\nshm %d\n", static_cast<unsigned long long>(bytes),
                  world, c->uses_shared_memory() ? 1 : 0);
      for (const auto& [key, v] :
           {std::pair{"save_sharded", save_sharded}, std::pair{"save_chief_alone", save_chief},
            std::pair{"restore_sharded_every_worker", restore_sharded},
            std::pair{"restore_chief_every_worker", restore_chief}}) {
        std::printf("%s_seconds %.4f\n%s_gib_per_s %.3f\n", key, median(v), key, gib / median(v));
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 1;
  }
  return 0;
}
