// MemorySnapshots: BackupAndRestore's state into the launcher's memory (memory_snapshots.h).
#include "memory_snapshots.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/cpus.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/distribute/collectives.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"
#include "dtrain/optim/optimizer.h"
#include "dtrain/train/backup_and_restore.h"
#include "fit_loop.h"
#include "snapshot_slots.h"
#include "training_state.h"

namespace dtrain::train {
namespace {

// One MemorySnapshots per process at a time owns DTRAIN_SNAPSHOT_DIR (a second BackupAndRestore
// in the same fit() takes none), and the agreed snapshot is restored once per process (a
// program that calls fit() again continues from its own state).
std::atomic<bool> active{false};
std::atomic<bool> restored{false};

namespace fs = std::filesystem;

// A snapshot's files (`<prefix>.index`, `<prefix>.data-*`) as one blob for the broadcast, read
// straight into the tensor that is broadcast: per file, its name's length (8 bytes), the name,
// its size (8 bytes) and its bytes. Undefined when a file cannot be read (the receivers fall
// back to the launcher's copy).
Tensor pack_snapshot(const std::string& prefix) {
  const fs::path dir = fs::path(prefix).parent_path();
  const std::string base = fs::path(prefix).filename().string();
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == base + ".index" || name.rfind(base + ".data-", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  if (ec || std::find(names.begin(), names.end(), base + ".index") == names.end()) return {};
  std::vector<uint64_t> sizes;
  int64_t total = 0;
  for (const std::string& name : names) {
    sizes.push_back(fs::file_size(dir / name, ec));
    if (ec) return {};
    total += static_cast<int64_t>(16 + name.size() + sizes.back());
  }
  Tensor blob(DType::kUInt8, Shape{total});
  uint8_t* at = blob.data<uint8_t>();
  const auto put = [&at](uint64_t v) {
    std::memcpy(at, &v, 8);
    at += 8;
  };
  for (size_t i = 0; i < names.size(); ++i) {
    put(names[i].size());
    std::memcpy(at, names[i].data(), names[i].size());
    at += names[i].size();
    put(sizes[i]);
    const int fd = ::open((dir / names[i]).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return {};
    const int64_t done = pread_full(fd, at, sizes[i], 0);
    ::close(fd);
    if (done != static_cast<int64_t>(sizes[i])) return {};  // shorter than its size a moment ago
    at += sizes[i];
  }
  return blob;
}

// The files of a blob (pack_snapshot's) as the bundle `<base>` in memory, viewing the blob's
// bytes; throws DataLossError for a malformed blob or one without the bundle's files.
checkpoint::BundleBytes snapshot_bytes(const uint8_t* blob, size_t size, const std::string& base) {
  size_t at = 0;
  const auto get = [&](const char* what) {
    uint64_t v = 0;
    if (size - at < 8) {
      throw DataLossError(
          str_cat("the broadcast snapshot is truncated at byte ", at, " (", what, ")"));
    }
    std::memcpy(&v, blob + at, 8);
    at += 8;
    return v;
  };
  std::map<std::string, std::string_view> files;
  while (at < size) {
    const uint64_t n = get("a name's length");
    if (n > size - at) throw DataLossError("the broadcast snapshot is truncated (a name)");
    const std::string name(reinterpret_cast<const char*>(blob + at), n);
    at += n;
    const uint64_t bytes = get("a file's size");
    if (bytes > size - at) {
      throw DataLossError(str_cat("the broadcast snapshot's ", name, " is truncated"));
    }
    files[name] = std::string_view(reinterpret_cast<const char*>(blob + at), bytes);
    at += bytes;
  }
  checkpoint::BundleBytes out;
  const auto index = files.find(base + ".index");
  if (index == files.end()) {
    throw DataLossError(str_cat("the broadcast snapshot has no ", base, ".index"));
  }
  out.index = index->second;
  // The data shards, in order (their names sort by shard number).
  std::vector<std::pair<std::string, std::string_view>> shards;
  for (const auto& [name, bytes] : files) {
    if (name.rfind(base + ".data-", 0) == 0) shards.emplace_back(name, bytes);
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    const std::string want =
        checkpoint::data_filename(base, static_cast<int>(i), static_cast<int>(shards.size()));
    if (shards[i].first != want) {
      throw DataLossError(
          str_cat("the broadcast snapshot holds ", shards[i].first, " where ", want, " belongs"));
    }
    out.shards.push_back(shards[i].second);
  }
  return out;
}

// Tells the launcher where this newcomer's state came from (snapshot_restore/<gen>/<rank>, an
// event in its log). Best effort.
void report_snapshot_source(const nlohmann::json& report) {
  try {
    if (!distribute::LauncherEnv::present()) return;
    const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
    if (!env.master) return;
    distribute::CoordinationClient client(
        env.master->to_string(),
        {.connect_timeout = std::chrono::seconds(5), .rpc_timeout = std::chrono::seconds(5)});
    // A survivor's report names the generation it joined (its environment names its first).
    const int64_t generation = report.value("generation", env.generation);
    client.set(str_cat("snapshot_restore/", generation, "/", env.rank), report.dump());
  } catch (const Error& e) {
    std::cerr << "BackupAndRestore: could not report the snapshot's source to the launcher: "
              << e.what() << "\n";
  }
}

double monotonic_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

std::string survivor_announcement_key(const std::string& run_id, int64_t generation, int rank) {
  return str_cat("dtrain/", run_id, "/launch/g", generation, "/next/", rank);
}

bool MemorySnapshots::survives_failures() {
  const char* mode = std::getenv(kEnvOnFailure);
  if (mode == nullptr || std::string(mode) != "survivors") return false;
  if (!distribute::LauncherEnv::present()) return false;
  return distribute::LauncherEnv::from_environment().rdzv_is_coordinator();
}

NextGeneration MemorySnapshots::await_next_generation(int64_t generation,
                                                      distribute::KeyValueStore* service,
                                                      std::chrono::milliseconds timeout) {
  const distribute::LauncherEnv env = distribute::LauncherEnv::from_environment();
  const std::string key = survivor_announcement_key(env.run_id, generation, env.rank);
  std::cerr << "fit: the collectives of generation " << generation
            << " failed; this worker keeps running and waits for the next generation\n";
  // A new client costs a connection (2-10 ms on a 2-vCPU VM) on the recovery's critical path.
  const auto* connected = dynamic_cast<distribute::CoordinationClient*>(service);
  std::optional<distribute::CoordinationClient> own;
  if (connected == nullptr || connected->address() != env.rdzv) {
    own.emplace(env.rdzv, distribute::CoordinationClientOptions{
                              .connect_timeout = std::chrono::seconds(10), .rpc_timeout = timeout});
    service = &*own;
  }
  const std::string text = service->get(key, timeout);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  NextGeneration next;
  try {
    next.generation = j.at("generation").get<int64_t>();
    next.restore = j.at("restore").get<std::string>();
    next.source = j.value("source", std::string());
    next.state_root = j.value("state_root", -1);
    next.announced_at = monotonic_seconds();
  } catch (const std::exception&) {
    throw DataLossError(str_cat("fit: the launcher's announcement ", key, " = '", text,
                                "' is not {\"generation\", \"restore\", \"source\"}"));
  }
  DTRAIN_CHECK(next.generation > generation && !next.restore.empty(), "fit: the launcher's ",
               "announcement ", key, " = '", text, "' names no later generation and snapshot");
  // Read now: the newcomers are still connecting, and this worker waits for them next.
  if (next.state_root >= 0) next.packed = pack_snapshot(next.restore);
  return next;
}

void MemorySnapshots::roll_back(checkpoint::Checkpoint& ckpt, const NextGeneration& next) {
  const double rejoined = monotonic_seconds();  // the new generation's collectives connected
  // No commit is in flight while the state is replaced (and the later steps' snapshots are
  // rewritten from here on).
  flush_commits();
  try {
    ckpt.restore(next.restore).assert_existing_objects_matched();
  } catch (const Error& e) {
    throw DataLossError(str_cat("BackupAndRestore: cannot roll back to the agreed in-memory ",
                                "snapshot ", next.restore, ": ", e.what()));
  }
  last_ = -1;
  to_share_ = next;
  // A survivor's phases, sent after its first step in the new generation (after_step).
  report_ = nlohmann::json{{"source", "local_memory"},
                           {"survivor", true},
                           {"generation", next.generation},
                           {"checkpoint", fs::path(next.restore).filename().string()},
                           {"announced", next.announced_at},
                           {"rejoined", rejoined},
                           {"rolled_back", monotonic_seconds()}};
  std::cerr << "BackupAndRestore: rolled back to "
            << std::filesystem::path(next.restore).filename().string() << " from "
            << (next.source.empty() ? "the launcher's memory" : next.source)
            << " in the surviving process (no disk read); joining generation " << next.generation
            << "\n";
}

std::unique_ptr<MemorySnapshots> MemorySnapshots::from_environment(std::optional<int64_t> every) {
  DTRAIN_CHECK(!every || *every >= 0, "BackupAndRestore: snapshot_every must be >= 0, got ",
               every.value_or(0));
  const char* dir = std::getenv(kEnvSnapshotDir);
  if (dir == nullptr || *dir == '\0') return nullptr;
  if (!every) {
    const char* env = std::getenv(kEnvSnapshotEvery);
    int64_t n = 0;
    try {
      size_t used = 0;
      n = env ? std::stoll(env, &used) : 0;
      if (env && (used != std::string(env).size() || n < 0)) throw std::invalid_argument("");
    } catch (const std::exception&) {
      throw InvalidArgumentError(
          str_cat(kEnvSnapshotEvery, "='", env, "': expected a non-negative number of steps"));
    }
    every = n;
  }
  if (*every == 0 || active.exchange(true)) return nullptr;
  return std::make_unique<MemorySnapshots>(dir, *every);
}

MemorySnapshots::MemorySnapshots(std::string dir, int64_t every)
    : dir_(std::move(dir)), every_(every) {}

MemorySnapshots::~MemorySnapshots() {
  try {
    end();
  } catch (...) {
  }
  active = false;
}

bool MemorySnapshots::spare_cpu_for_commits() {
  int local_workers = 1;
  if (const char* env = std::getenv(distribute::kEnvLocalWorldSize)) {
    local_workers = std::max(1, std::atoi(env));
  }
  return usable_cpus() > local_workers * std::max(1, intra_op_threads());
}

void MemorySnapshots::begin(std::vector<std::pair<std::string, checkpoint::Trackable>> children) {
  for (const auto& [name, t] : children) {
    if (name == "metric_states") metric_states_ = t;
  }
  ckpt_ = std::make_unique<checkpoint::Checkpoint>(std::move(children));
  // The commit (renames, index, state file, the oldest dropped: about 17 system calls) runs
  // beside training where a CPU is free for it, so that the training thread pays only for the copy
  // that isolates the state. Where this node's workers' threads fill every CPU it may use, a
  // thread beside training only takes the CPU from a training thread (its own worker's or a
  // peer's that its next collective then waits for): there the commit runs on the training
  // thread, which costs that worker less (docs/decisions.md, "Snapshot commits").
  // With journal commits there is no commit to move: the trailer makes a snapshot
  // whole, and its files are made when asked for (docs/decisions.md, "Journal commits").
  const char* commit = std::getenv(kEnvSnapshotCommit);
  const bool journal = commit != nullptr && std::string_view(commit) == "journal";
  slots_ = std::make_unique<SnapshotSlots>(
      dir_, *ckpt_,
      SnapshotSlotsOptions{.max_to_keep = kSnapshotsKept,
                           .commit_in_background = !journal && spare_cpu_for_commits(),
                           .journal = journal});
  if (slots_->slots_adopted() > 0) {
    std::cerr << "BackupAndRestore: " << slots_->slots_adopted()
              << " snapshot slots made while standing by\n";
  }
}

std::optional<std::string> MemorySnapshots::restore_agreed(checkpoint::Checkpoint& ckpt) {
  const char* path = std::getenv(kEnvSnapshotRestore);
  if (path == nullptr || *path == '\0' || restored.exchange(true)) return std::nullopt;
  const char* source = std::getenv(kEnvSnapshotSource);
  try {
    ckpt.restore(path).assert_existing_objects_matched();
  } catch (const Error& e) {
    throw DataLossError(str_cat("BackupAndRestore: cannot restore the agreed in-memory snapshot ",
                                path, ": ", e.what()));
  }
  std::cerr << "BackupAndRestore: restored " << std::filesystem::path(path).filename().string()
            << " from " << (source ? source : "the launcher's memory") << " (no disk read)\n";
  return std::string(path);
}

std::optional<int> MemorySnapshots::broadcast_root() {
  const char* v = std::getenv(kEnvSnapshotBroadcastRoot);
  if (v == nullptr || *v == '\0') return std::nullopt;
  try {
    size_t used = 0;
    const int root = std::stoi(v, &used);
    if (used == std::string(v).size() && root >= 0) return root;
  } catch (const std::exception&) {
  }
  throw InvalidArgumentError(
      str_cat(kEnvSnapshotBroadcastRoot, "='", v, "': expected a rank (an integer >= 0)"));
}

void MemorySnapshots::share_state(distribute::Collectives& collectives) {
  if (!to_share_ || to_share_->state_root < 0) return;
  const int root = to_share_->state_root;
  const bool sender = collectives.rank() == root;
  Tensor blob = std::move(to_share_->packed);
  if (sender && !blob.defined()) blob = pack_snapshot(to_share_->restore);
  Tensor size(DType::kInt64, Shape{1});
  size.data<int64_t>()[0] = sender ? (blob.defined() ? blob.dim(0) : -1) : 0;
  std::vector<Tensor> header{size};
  collectives.broadcast(header, root);
  const int64_t n = header[0].data<int64_t>()[0];
  if (n > 0) {
    // Every member takes part; the other survivors hold the state already and drop the copy.
    if (!blob.defined() || blob.dim(0) != n) blob = Tensor(DType::kUInt8, Shape{n});
    std::vector<Tensor> body{std::move(blob)};
    collectives.broadcast(body, root);
  }
  if (sender) {
    std::cerr << "BackupAndRestore: "
              << (n > 0 ? str_cat("sent ", fs::path(to_share_->restore).filename().string(), " (",
                                  n, " bytes) to the generation's newcomers by broadcast")
                        : str_cat("cannot read ", to_share_->restore,
                                  "; the newcomers restore from their launcher's memory"))
              << "\n";
  }
  if (report_) (*report_)["shared"] = monotonic_seconds();
  to_share_.reset();
}

std::optional<std::string> MemorySnapshots::receive_state(checkpoint::Checkpoint& ckpt,
                                                          distribute::Collectives& collectives,
                                                          bool rank_independent) {
  const char* own = std::getenv(kEnvSnapshotRestore);
  const std::optional<int> root = broadcast_root();
  if (!root || own == nullptr || *own == '\0' || restored.load()) return restore_agreed(ckpt);
  const double started = monotonic_seconds();
  std::vector<Tensor> header{Tensor(DType::kInt64, Shape{1})};
  header[0].data<int64_t>()[0] = 0;
  collectives.broadcast(header, *root);
  const int64_t n = header[0].data<int64_t>()[0];
  if (n <= 0) {
    std::cerr << "BackupAndRestore: rank " << *root << " could not send the agreed snapshot; "
              << "restoring it from the launcher's memory\n";
    return restore_agreed(ckpt);
  }
  std::vector<Tensor> body{Tensor(DType::kUInt8, Shape{n})};
  collectives.broadcast(body, *root);
  const double received = monotonic_seconds();
  restored = true;
  const std::string base = fs::path(own).filename().string();
  // Restored from the received bytes (no file): the reader checks the index's checksums and
  // every tensor's CRC-32C as it would the files'.
  try {
    const checkpoint::BundleBytes bytes =
        snapshot_bytes(body[0].data<uint8_t>(), static_cast<size_t>(n), base);
    ckpt.restore(str_cat(base, " (received from rank ", *root, ")"), bytes)
        .assert_existing_objects_matched();
    if (!rank_independent && metric_states_) {
      // The epoch's partial metric sums are this rank's own (each worker sums its shard).
      checkpoint::Checkpoint mine({{"metric_states", *metric_states_}});
      mine.restore(own).expect_partial();
    }
  } catch (const Error& e) {
    throw DataLossError(str_cat("BackupAndRestore: cannot restore ", base, " received from rank ",
                                *root, ": ", e.what()));
  }
  const double done = monotonic_seconds();
  std::cerr << "BackupAndRestore: restored " << base << " received from rank " << *root
            << " (a survivor) by broadcast (" << n << " bytes)\n";
  // Sent after this worker's first step (after_step), with its time: the phases of the
  // recovery on one clock (CLOCK_MONOTONIC, the launcher's too).
  report_ = nlohmann::json{{"source", "survivor"}, {"from_rank", *root}, {"checkpoint", base},
                           {"bytes", n},           {"started", started}, {"received", received},
                           {"restored", done}};
  if (const char* at = std::getenv(kEnvStandbyAssignedAt)) {
    try {
      (*report_)["assigned"] = std::stod(at);
    } catch (const std::exception&) {
    }
  }
  return std::string(own);
}

void MemorySnapshots::after_step(BackupAndRestore& backups, TrainingState& ts) {
  if (report_) {
    (*report_)["first_step"] = monotonic_seconds();
    report_snapshot_source(*std::exchange(report_, std::nullopt));
  }
  if (!slots_) return;
  if (first_step_at_ == 0) first_step_at_ = monotonic_seconds();
  const int64_t step = ts.optimizer->iterations();
  if (step == last_ || step % every_ != 0) return;
  last_ = step;
  struct Timed {  // the whole snapshot, on the training thread, for end()'s report
    MemorySnapshots& m;
    double start = monotonic_seconds();
    ~Timed() {
      m.snapshot_seconds_ += monotonic_seconds() - start;
      ++m.snapshots_taken_;
    }
  } timed{*this};
  ts.loop->before_checkpoint();
  backups.capture();
  try {
    // Numbered by the global step, so that every worker's snapshot of one step has one name.
    // Throws the previous snapshot's commit error, if it failed, before this one is taken.
    slots_->save(step);
  } catch (const Error& e) {
    // A snapshot never stops training: the launchers agree on a step every rank holds.
    std::cerr << "BackupAndRestore: an in-memory snapshot failed (at step " << step
              << "): " << e.what() << "\n";
  }
}

void MemorySnapshots::flush_commits() {
  if (!slots_) return;
  try {
    slots_->flush();
  } catch (const Error& e) {
    std::cerr << "BackupAndRestore: an in-memory snapshot failed: " << e.what() << "\n";
  }
}

void MemorySnapshots::materialize() { flush_commits(); }

void MemorySnapshots::end() {
  flush_commits();
  if (report_) report_snapshot_source(*std::exchange(report_, std::nullopt));
  if (snapshots_taken_ > 0) {
    // What the snapshots cost this worker: their time on the training thread against the time
    // since its first step (the "snapshot overhead", measured where it is paid).
    const double since = monotonic_seconds() - first_step_at_;
    char line[256];
    std::snprintf(line, sizeof line,
                  "BackupAndRestore: %lld in-memory snapshots (every %lld steps) took %.3f ms each "
                  "on the training thread: %.2f%% of the %.2f s since the first step\n",
                  static_cast<long long>(snapshots_taken_), static_cast<long long>(every_),
                  1e3 * snapshot_seconds_ / static_cast<double>(snapshots_taken_),
                  since > 0 ? 100 * snapshot_seconds_ / since : 0.0, since);
    std::cerr << line;
    snapshots_taken_ = 0;
    snapshot_seconds_ = 0;
    first_step_at_ = 0;
  }
  slots_.reset();
  ckpt_.reset();
}

}  // namespace dtrain::train
