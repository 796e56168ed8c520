// The launcher's in-memory snapshots (snapshots.h): the directory the workers write into, the
// replication to the ring neighbour, and the agreement on the step to resume from.
#include "fault/snapshots.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "core/tcp.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "dtrain/distribute/multi_worker_mirrored_strategy.h"
#include "fault/launch_events.h"
#include "fault/launch_util.h"
#include "fault/worker_process.h"
#include "train/snapshot_journal.h"

namespace dtrain::fault {
namespace {

namespace fs = std::filesystem;

constexpr const char* kDirPrefix = "dtrain-snapshots-";
constexpr const char* kFetched = "fetched";
constexpr const char* kPinned = "pinned";
const std::chrono::milliseconds kPushTimeout = std::chrono::seconds(10);
const std::chrono::milliseconds kPublishTimeout = std::chrono::seconds(60);

std::string rank_key(int world_size, int rank) { return str_cat("w", world_size, "-r", rank); }

// "w<W>-" of a rank key ("" for a name that is not one).
std::string world_prefix(const std::string& key) {
  const size_t r = key.find("-r");
  return key.size() > 1 && key[0] == 'w' && r != std::string::npos ? key.substr(0, r + 1) : "";
}

bool is_rank_directory(const fs::directory_entry& e) {
  const std::string key = e.path().filename().string();
  return e.is_directory() && key != kFetched && key != kPinned;
}

// Removes the snapshot directories of agents that are gone (a launcher killed with SIGKILL
// cannot remove its own): ".../dtrain-snapshots-<run>-n<node>-p<pid>" whose pid is not alive.
void remove_dead_agents_directories(const fs::path& base) {
  static const std::regex name(std::string(kDirPrefix) + R"(.*-p(\d+))");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(base, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (!std::regex_match(n, m, name)) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(m[1].str()));
    if (::kill(pid, 0) != 0 && errno == ESRCH) fs::remove_all(e.path(), ec);
  }
}

// The file names of snapshot `step` in a rank directory: "snap-<step>.index" and its data
// shards (temporary files of a writer are not).
bool snapshot_file(const std::string& file, int64_t step) {
  const std::string prefix = str_cat("snap-", step, ".");
  if (file.rfind(prefix, 0) != 0) return false;
  static const std::regex suffix(R"(index|data-\d{5}-of-\d{5})");
  return std::regex_match(file.substr(prefix.size()), suffix);
}

// Reads committed snapshot `step` of directory `dir` whole; nullopt when it vanished, or was
// being rewritten, meanwhile. The worker rewrites the data files of dropped snapshots in place
// (train/snapshot_slots.h): every file is held with a shared flock while it is read (a worker
// reuses only a file it can lock exclusively, and holds that lock until the snapshot written
// into it is committed), and every name must name the file read both before and after the read,
// so that the bytes returned are one committed snapshot's.
std::optional<SnapshotFiles> read_snapshot(const fs::path& dir, int64_t step) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (snapshot_file(n, step)) names.push_back(n);
  }
  std::sort(names.begin(), names.end());
  if (names.size() < 2) return std::nullopt;  // an index and at least one data shard
  const auto same_file = [](const std::string& path, const struct stat& held) {
    struct stat named {};
    return ::stat(path.c_str(), &named) == 0 && named.st_dev == held.st_dev &&
           named.st_ino == held.st_ino;
  };
  std::vector<std::unique_ptr<tcp::Fd>> fds;
  std::vector<struct stat> held(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string path = (dir / names[i]).string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;
    fds.push_back(std::make_unique<tcp::Fd>(fd));
    if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) return std::nullopt;
    if (::fstat(fd, &held[i]) != 0 || !same_file(path, held[i])) return std::nullopt;
  }
  SnapshotFiles files;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string path = (dir / names[i]).string();
    std::string bytes;
    try {
      bytes = read_to_end(fds[i]->fd, path);
    } catch (const Error&) {
      return std::nullopt;
    }
    if (static_cast<off_t>(bytes.size()) != held[i].st_size) return std::nullopt;
    files.emplace_back(names[i].substr(str_cat("snap-", step).size()), std::move(bytes));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!same_file((dir / names[i]).string(), held[i])) return std::nullopt;
  }
  return files;
}

// pin_local's part for a snapshot that only its slot holds: links the slot and writes its index
// into `staging`; false when it was dropped or rewritten meanwhile.
bool pin_slot(const fs::path& rank_dir, int64_t step, const fs::path& staging) {
  for (const train::JournaledSnapshot& j :
       train::journaled_snapshots(rank_dir.string(), train::kMemorySnapshotName)) {
    if (j.record.step != step) continue;
    const fs::path data = staging / str_cat("snap-", step, ".data-00000-of-00001");
    if (::link(j.slot.c_str(), data.c_str()) != 0) return false;
    // Through the link: a worker that drops the slot from now on sees a second link and never
    // rewrites it; one that took it before is rewriting it (locked) or has (another step).
    const int fd = ::open(data.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const std::optional<train::JournalRecord> r = train::read_whole(fd, step);
    ::close(fd);
    if (!r) return false;
    try {
      write_file_atomically((staging / str_cat("snap-", step, ".index")).string(), r->index,
                            AtomicFileOptions{.sync = false});
    } catch (const Error& e) {  // a full tmpfs, say: this step is not pinned, as when it moved
      say("snapshots: cannot pin step ", step, " of ", rank_dir.string(), ": ", e.what());
      return false;
    }
    return true;
  }
  return false;
}

void write_snapshot(const fs::path& dir, int64_t step, const SnapshotFiles& files) {
  fs::create_directories(dir);
  for (const auto& [suffix, bytes] : files) {
    DTRAIN_CHECK(suffix.find('/') == std::string::npos && !suffix.empty(),
                 "snapshots: bad file name '", suffix, "' for step ", step);
    write_file_atomically((dir / str_cat("snap-", step, suffix)).string(), bytes,
                          AtomicFileOptions{.sync = false});
  }
}

}  // namespace

std::string snapshot_agent_host(const std::string& service) { return tcp::reachable_host(service); }

SnapshotKeeper::SnapshotKeeper(SnapshotKeeperOptions options) : o_(std::move(options)) {
  fs::path base = o_.root;
  if (base.empty()) {
    std::error_code ec;
    base = fs::is_directory("/dev/shm", ec) ? fs::path("/dev/shm") : fs::temp_directory_path();
  }
  fs::create_directories(base);
  remove_dead_agents_directories(base);
  dir_ = (base / str_cat(kDirPrefix, o_.run_id, "-n", o_.node, "-p", ::getpid())).string();
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  server_ = std::make_unique<SnapshotServer>(
      "",
      [this](const std::string& key, int64_t step, SnapshotFiles files) {
        store_peer(key, step, std::move(files));
      },
      [this](const std::string& key, int64_t step) { return find(key, step); });
  address_ = str_cat(o_.host, ":", server_->port());
  replicator_ = std::thread([this] { replicate(); });
}

SnapshotKeeper::~SnapshotKeeper() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (replicator_.joinable()) replicator_.join();
  server_.reset();
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

std::vector<int64_t> SnapshotKeeper::local_steps(const std::string& key) const {
  // The slots' trailers and the state file (a live worker makes files only when asked).
  return train::snapshot_steps((fs::path(dir_) / key).string(), train::kMemorySnapshotName);
}

std::optional<SnapshotFiles> SnapshotKeeper::read_local(const std::string& key,
                                                        int64_t step) const {
  const fs::path dir = fs::path(dir_) / key;
  if (std::optional<SnapshotFiles> files = read_snapshot(dir, step)) return files;
  // Only in its slot (no files made): read under the slot's lock.
  std::optional<train::JournaledBytes> j =
      train::read_journaled(dir.string(), train::kMemorySnapshotName, step);
  if (!j) return std::nullopt;
  return SnapshotFiles{{".data-00000-of-00001", std::move(j->data)},
                       {".index", std::move(j->index)}};
}

void SnapshotKeeper::store_peer(const std::string& key, int64_t step, SnapshotFiles files) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto& held = peer_[key];
    held[step] = std::move(files);
    while (static_cast<int>(held.size()) > o_.keep_per_rank) held.erase(held.begin());
  }
  const std::string world = world_prefix(key);
  if (!world.empty()) pin_local(std::stoi(world.substr(1)), step);
}

void SnapshotKeeper::pin_local(int world_size, int64_t step) {
  std::lock_guard<std::mutex> lock(pin_mu_);
  const std::string world = str_cat("w", world_size, "-");
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string key = e.path().filename().string();
    if (!is_rank_directory(e) || key.rfind(world, 0) != 0) continue;
    const std::vector<int64_t> local = local_steps(key);
    if (std::find(local.begin(), local.end(), step) == local.end()) continue;
    const fs::path pinned = fs::path(dir_) / kPinned / key;
    const fs::path into = pinned / str_cat(step);
    if (fs::is_directory(into, ec)) continue;
    const fs::path staging = pinned / str_cat(step, ".tmp");
    fs::remove_all(staging, ec);
    fs::create_directories(staging, ec);
    // The worker only unlinks snapshot files (it never rewrites one in place), so every link
    // that succeeds is of the committed file; a file rotated away meanwhile fails the pin.
    int linked = 0;
    bool whole = !ec;
    for (const auto& f : fs::directory_iterator(e.path(), ec)) {
      const std::string n = f.path().filename().string();
      if (!whole || !snapshot_file(n, step)) continue;
      whole = ::link(f.path().c_str(), (staging / n).c_str()) == 0;
      ++linked;
    }
    if (whole && linked == 0) {
      // Only in its slot (no files made): the slot itself is linked.
      whole = pin_slot(e.path(), step, staging);
    } else if (whole && linked >= 2) {
      // Every link is of the file its name held, and still holds, for a step still committed:
      // a snapshot rewritten while it was linked (a rollback rewrites a step) fails the pin.
      for (const auto& f : fs::directory_iterator(staging, ec)) {
        struct stat pinned_st {};
        struct stat named_st {};
        whole = whole && ::stat(f.path().c_str(), &pinned_st) == 0 &&
                ::stat((e.path() / f.path().filename()).c_str(), &named_st) == 0 &&
                pinned_st.st_ino == named_st.st_ino && pinned_st.st_dev == named_st.st_dev;
      }
      const std::vector<int64_t> still = local_steps(key);
      whole = whole && std::find(still.begin(), still.end(), step) != still.end();
    } else {
      whole = false;  // the index or the data file alone
    }
    if (!whole || ::rename(staging.c_str(), into.c_str()) != 0) {
      fs::remove_all(staging, ec);
      continue;
    }
    std::vector<int64_t> steps = pinned_steps(key);
    std::sort(steps.begin(), steps.end());
    for (size_t i = 0; i + o_.keep_per_rank < steps.size(); ++i) {
      fs::remove_all(pinned / str_cat(steps[i]), ec);
    }
  }
}

std::vector<int64_t> SnapshotKeeper::pinned_steps(const std::string& key) const {
  static const std::regex digits(R"(\d+)");
  std::vector<int64_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(dir_) / kPinned / key, ec)) {
    const std::string n = e.path().filename().string();
    if (std::regex_match(n, digits)) out.push_back(std::stoll(n));
  }
  return out;
}

std::string SnapshotKeeper::pinned_prefix(const std::string& key, int64_t step) const {
  const fs::path dir = fs::path(dir_) / kPinned / key / str_cat(step);
  std::error_code ec;
  return fs::is_directory(dir, ec) ? (dir / str_cat("snap-", step)).string() : "";
}

std::optional<SnapshotFiles> SnapshotKeeper::find(const std::string& key, int64_t step) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = peer_.find(key); it != peer_.end()) {
      if (auto s = it->second.find(step); s != it->second.end()) return s->second;
    }
  }
  const std::vector<int64_t> local = local_steps(key);
  if (std::find(local.begin(), local.end(), step) != local.end()) {
    if (auto files = read_local(key, step)) return files;
  }
  const std::string pinned = pinned_prefix(key, step);
  if (pinned.empty()) return std::nullopt;
  return read_snapshot(fs::path(pinned).parent_path(), step);
}

SnapshotKeeper::Held SnapshotKeeper::holdings() {
  Held h{.address = address_, .steps = {}};
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    const std::string key = e.path().filename().string();
    if (!is_rank_directory(e)) continue;
    for (int64_t s : local_steps(key)) h.steps[key].push_back(s);
  }
  for (const auto& e : fs::directory_iterator(fs::path(dir_) / kPinned, ec)) {
    const std::string key = e.path().filename().string();
    for (int64_t s : pinned_steps(key)) h.steps[key].push_back(s);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, held] : peer_) {
    for (const auto& [s, files] : held) h.steps[key].push_back(s);
  }
  return h;
}

void SnapshotKeeper::prepare(const Generation& g, distribute::CoordinationClient& client,
                             FaultRecorder& recorder, bool restart) {
  // Nothing can be held before this launcher's first generation, except by the other agents of
  // a job this launcher joins late (a node started again after it was lost).
  restore_.clear();
  source_.clear();
  world_size_ = g.world_size;
  std::error_code ec;
  fs::remove_all(fs::path(dir_) / kFetched, ec);
  // The snapshots of workers that are gone get their files (a live worker's directory is
  // locked, and skipped: it makes them itself when it needs them).
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    if (!is_rank_directory(e)) continue;
    try {
      train::materialize_journal(e.path().string(), train::kMemorySnapshotName);
    } catch (const Error& err) {
      say("snapshots: ", err.what());
    }
  }

  // 1. What every member holds (this agent's own workers' snapshots and its neighbour's).
  const auto key_of = [&](int node) {
    return str_cat("dtrain/", o_.run_id, "/snapshots/g", g.number, "/n", node);
  };
  const Held mine = holdings();
  nlohmann::json j = {{"address", mine.address}, {"steps", mine.steps}};
  client.set(key_of(o_.node), j.dump());
  std::map<int, Held> all;
  for (int node : g.nodes) {
    if (node == o_.node) {
      all[node] = mine;
      continue;
    }
    try {
      const nlohmann::json other = nlohmann::json::parse(client.get(key_of(node), kPublishTimeout));
      all[node] =
          Held{.address = other.at("address").get<std::string>(),
               .steps = other.at("steps").get<std::map<std::string, std::vector<int64_t>>>()};
    } catch (const std::exception& e) {
      // Every member publishes before it waits, so this is a node lost meanwhile: its workers
      // will not start, and the generation fails again.
      say("snapshots: no holdings from node ", node, ": ", e.what());
      all[node] = Held{};
    }
  }

  // 2. The ring neighbour this node's snapshots go to from now on.
  const auto at = std::find(g.nodes.begin(), g.nodes.end(), o_.node);
  std::string neighbour;
  if (g.nodes.size() > 1 && at != g.nodes.end()) {
    const int next = *(std::next(at) == g.nodes.end() ? g.nodes.begin() : std::next(at));
    neighbour = all[next].address;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (neighbour != neighbour_) pushed_.clear();
    neighbour_ = neighbour;
  }
  cv_.notify_all();

  // 3. The newest step that every rank of the new world holds somewhere (the same answer on
  // every member: the same inputs, the same rule).
  const auto holders = [&](const std::string& key, int64_t step) {
    std::vector<int> out;
    for (const auto& [node, held] : all) {
      auto it = held.steps.find(key);
      if (it != held.steps.end() &&
          std::find(it->second.begin(), it->second.end(), step) != it->second.end()) {
        out.push_back(node);
      }
    }
    return out;
  };
  std::set<int64_t> candidates;
  for (const auto& [node, held] : all) {
    if (auto it = held.steps.find(rank_key(g.world_size, 0)); it != held.steps.end()) {
      candidates.insert(it->second.begin(), it->second.end());
    }
  }
  std::optional<int64_t> agreed;
  for (auto it = candidates.rbegin(); it != candidates.rend() && !agreed; ++it) {
    bool complete = true;
    for (int r = 0; r < g.world_size && complete; ++r) {
      complete = !holders(rank_key(g.world_size, r), *it).empty();
    }
    if (complete) agreed = *it;
  }
  // Rank 0's newest snapshot of any world size, when newer than the complete set (a resized
  // world has none), restored into every rank — what the backups on disk would give (every
  // worker restores the chief's), from memory. With such state a step's snapshot is the same
  // whichever world or timeline took it. Only for a job whose chief declared its state
  // independent of the world size (MultiWorkerOptions::logical_replicas): then it is exact.
  std::string source_key;  // empty: each rank its own key
  const std::string independent[] = {distribute::world_size_independent_key(o_.run_id)};
  const bool any_world_size = client.check(independent);
  for (const auto& [node, held] : all) {
    if (!any_world_size) break;
    for (const auto& [key, steps] : held.steps) {
      if (key.size() < 4 || key.compare(key.size() - 3, 3, "-r0") != 0) {
        continue;
      }
      for (int64_t step : steps) {
        if ((!agreed || step > *agreed) ||
            (step == *agreed && !source_key.empty() && key < source_key)) {
          agreed = step;
          source_key = key;
        }
      }
    }
  }
  if (!agreed) {
    if (restart) {
      FaultEvent e = event_of(kEventSnapshotRestore, g.number);
      e.node = o_.node;
      e.extra["source"] = "disk";
      e.message = str_cat("no complete in-memory snapshot set for ", g.world_size,
                          " workers; the workers restore from their backups on disk");
      say(e.message);
      recorder.record(e);
    }
    return;
  }

  // 4. This node's workers' copies: local, else fetched from a member that holds one.
  for (size_t i = 0; i < g.slots.size(); ++i) {
    const int rank = g.rank_offset + static_cast<int>(i);
    const std::string own = rank_key(g.world_size, rank);
    const std::string key = source_key.empty() ? own : source_key;
    const std::vector<int64_t> local = local_steps(key);
    std::string prefix, source, kind;
    std::optional<int> from_node;
    if (std::find(local.begin(), local.end(), *agreed) != local.end()) {
      prefix = (fs::path(dir_) / key / str_cat("snap-", *agreed)).string();
      source = str_cat("local memory (node ", o_.node, ")");
      kind = "local_memory";
    } else if (const std::string pinned = pinned_prefix(key, *agreed); !pinned.empty()) {
      prefix = pinned;
      source = str_cat("local memory (node ", o_.node, ", pinned)");
      kind = "local_memory";
    } else {
      const fs::path fetched = fs::path(dir_) / kFetched / own;
      std::optional<SnapshotFiles> files;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (auto it = peer_.find(key); it != peer_.end()) {
          if (auto s = it->second.find(*agreed); s != it->second.end()) files = s->second;
        }
      }
      if (files) {
        source = str_cat("local memory (node ", o_.node, ", a replica)");
        kind = "local_memory";
      }
      for (int node : holders(key, *agreed)) {
        if (files) break;
        if (node == o_.node) continue;
        try {
          files = get_snapshot(all[node].address, key, *agreed, kPushTimeout);
        } catch (const Error& e) {
          say("snapshots: ", e.what());
        }
        if (files) {
          source = str_cat("peer memory (node ", node, ")");
          kind = "peer_memory";
          from_node = node;
        }
      }
      if (!files) {
        throw UnavailableError(str_cat("snapshots: no member could deliver rank ", rank,
                                       "'s snapshot of step ", *agreed));
      }
      write_snapshot(fetched, *agreed, *files);
      prefix = (fetched / str_cat("snap-", *agreed)).string();
    }
    restore_[rank] = prefix;
    source_[rank] = source;
    // Also in a launcher's first generation: a launcher started again for a lost node joins a
    // running job, and its workers resume from what the other agents hold.
    FaultEvent e = event_of(kEventSnapshotRestore, g.number);
    e.rank = rank;
    e.node = o_.node;
    e.resumed_step = *agreed;
    e.checkpoint = fs::path(prefix).filename().string();
    e.extra["source"] = kind;
    if (from_node) e.extra["from_node"] = std::to_string(*from_node);
    if (!source_key.empty()) e.extra["snapshot_of"] = key;
    e.message = str_cat("rank ", rank, ": restored step ", *agreed, " from ", source,
                        source_key.empty() ? "" : str_cat(", the snapshot of ", key));
    say(e.message);
    recorder.record(e);
  }
}

std::vector<std::string> SnapshotKeeper::environment(int rank) const {
  // The world size is part of the directory: a world restores its own ranks' snapshots, or,
  // when its size changed, rank 0's newest of another size (prepare()).
  std::vector<std::string> out;
  out.push_back(
      str_cat("DTRAIN_SNAPSHOT_DIR=", (fs::path(dir_) / rank_key(world_size_, rank)).string()));
  const auto it = restore_.find(rank);
  if (it != restore_.end()) {
    out.push_back(str_cat("DTRAIN_SNAPSHOT_RESTORE=", it->second));
    out.push_back(str_cat("DTRAIN_SNAPSHOT_SOURCE=", source_.at(rank)));
  }
  out.push_back(str_cat("DTRAIN_SNAPSHOT_EVERY=", o_.every));
  // This agent reads the slots' trailers either way (a snapshot's files come after them).
  out.push_back(str_cat("DTRAIN_SNAPSHOT_COMMIT=", o_.journal ? "journal" : "files"));
  return out;
}

std::optional<std::pair<std::string, std::string>> SnapshotKeeper::restore_of(int rank) const {
  const auto it = restore_.find(rank);
  if (it == restore_.end()) return std::nullopt;
  return std::make_pair(it->second, source_.at(rank));
}

void SnapshotKeeper::replicate() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // With no neighbour (one node) there is nothing to push: sleep until prepare() names one.
    if (neighbour_.empty()) {
      cv_.wait(lock, [this] { return stop_ || !neighbour_.empty(); });
    } else {
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
    if (stop_ || neighbour_.empty()) continue;
    const std::string neighbour = neighbour_;
    lock.unlock();
    bool failed = false;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(dir_, ec)) {
      const std::string key = e.path().filename().string();
      if (!is_rank_directory(e)) continue;
      const std::vector<int64_t> steps = local_steps(key);
      if (steps.empty()) continue;
      const int64_t newest = *std::max_element(steps.begin(), steps.end());
      {
        std::lock_guard<std::mutex> guard(mu_);
        if (auto p = pushed_.find(key); p != pushed_.end() && p->second == newest) continue;
      }
      const std::optional<SnapshotFiles> files = read_local(key, newest);
      if (!files) continue;  // dropped or rewritten meanwhile: the next pass sees the newer one
      try {
        put_snapshot(neighbour, key, newest, *files, kPushTimeout);
        std::lock_guard<std::mutex> guard(mu_);
        if (neighbour_ == neighbour) pushed_[key] = newest;
      } catch (const Error&) {
        failed = true;  // the neighbour is gone or restarting: the next generation names one
      }
    }
    lock.lock();
    if (failed) cv_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

}  // namespace dtrain::fault
