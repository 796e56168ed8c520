// SnapshotSlots: in-memory snapshots written in one pass into reused tmpfs slots
// (snapshot_slots.h).
#include "snapshot_slots.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"
#include "snapshot_journal.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Removes what a dead writer left: slot files (any: this process holds the directory's lock,
// so no live writer owns one), and write_file_atomically temporaries of dead processes.
void remove_leftovers(const std::string& dir, const std::string& name) {
  std::error_code ec;
  const std::string stem = journal_slot_stem(name);
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(stem, 0) == 0) {
      fs::remove(e.path(), ec);
      continue;
    }
    const size_t tmp = n.find(".tmp.");
    if (tmp == std::string::npos) continue;
    if (n.rfind(name + "-", 0) != 0 && n.compare(0, tmp, kSnapshotStateFile) != 0) continue;
    const long pid = std::strtol(n.c_str() + tmp + 5, nullptr, 10);
    if (pid <= 0 || (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)) {
      fs::remove(e.path(), ec);
    }
  }
}

// The bytes TF's BundleWriter writes for a scalar DT_STRING tensor holding `s` (varint length,
// masked CRC of the length, the bytes), and their CRC.
std::pair<std::string, uint32_t> string_tensor_bytes(const std::string& s) {
  auto [out, crc] = checkpoint::string_tensor_header({s});
  out += s;
  crc = crc32c::extend(crc, s.data(), s.size());
  return {std::move(out), crc};
}

}  // namespace

struct SnapshotSlots::Slot {
  int fd = -1;
  uint8_t* map = nullptr;
  size_t size = 0;    // of the file
  size_t mapped = 0;  // of the mapping: at least `size` (a slot shrunk in place keeps its map)
  std::string path;   // its current name

  ~Slot() {
    if (map != nullptr) ::munmap(map, mapped);
    if (fd >= 0) ::close(fd);
  }
  // Sizes the file to `bytes` (its pages allocated now: a full tmpfs fails here, never as a
  // SIGBUS in the copy) and maps it, pre-faulted.
  void resize(size_t bytes) {
    if (map != nullptr) ::munmap(map, mapped);
    map = nullptr;
    size = mapped = 0;
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw_file_error(errno, "resize", path);
    if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
      throw_file_error(err, "allocate", path);
    }
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (m == MAP_FAILED) throw_file_error(errno, "map", path);
    map = static_cast<uint8_t*>(m);
    size = mapped = bytes;
  }
  // resize(), but within the mapping the file is resized in place and the mapping kept (its
  // pages stay mapped and written).
  // Either way the trailer's place (the last bytes) holds no whole snapshot afterwards.
  void fit(size_t bytes) {
    if (bytes == size) return;
    if (map == nullptr || bytes == 0 || bytes > mapped) {
      resize(bytes);
    } else {
      if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) throw_file_error(errno, "resize", path);
      if (bytes > size) {
        if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); err != 0) {
          throw_file_error(err, "allocate", path);
        }
      }
      size = bytes;
    }
    if (size >= kJournalHeaderBytes)
      std::memset(map + size - kJournalHeaderBytes, 0, kJournalHeaderBytes);
  }
};

// prepare_standby_slots()'s slots until a SnapshotSlots takes them. Never destroyed: a spare's
// preparing thread may still be running when the process exits.
struct SnapshotSlots::StandbyPool {
  std::mutex mu;
  std::string dir;
  std::vector<std::unique_ptr<Slot>> slots;
};

SnapshotSlots::StandbyPool& SnapshotSlots::standby_pool() {
  static StandbyPool* pool = new StandbyPool;
  return *pool;
}

int SnapshotSlots::prepare_standby_slots(const std::string& dir, size_t bytes, int count,
                                         const std::atomic<bool>* stop) {
  DTRAIN_CHECK(bytes > 0 && count >= 0, "SnapshotSlots::prepare_standby_slots: ", count,
               " slots of ", bytes, " bytes");
  const auto stopped = [stop] { return stop != nullptr && stop->load(); };
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw_file_error(ec.value(), "create directory", dir);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  int kept = 0;
  for (int i = 0; i < count && !stopped(); ++i) {
    auto slot = std::make_unique<Slot>();
    slot->path = (fs::path(dir) / str_cat(".standby-slot-", ::getpid(), "-", i)).string();
    slot->fd = ::open(slot->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (slot->fd < 0) throw_file_error(errno, "create", slot->path);
    ::flock(slot->fd, LOCK_EX | LOCK_NB);  // as take_spare()'s new slots
    try {
      slot->resize(bytes);
    } catch (...) {
      ::unlink(slot->path.c_str());
      throw;
    }
    // One write per page (of the zero it holds): the mapping's entries for writing exist now.
    for (size_t off = 0; off < bytes; off += page) {
      reinterpret_cast<volatile uint8_t*>(slot->map)[off] = 0;
    }
    StandbyPool& pool = standby_pool();
    std::lock_guard<std::mutex> lock(pool.mu);
    if (stopped()) {  // taken over meanwhile: the constructor that adopts may have run
      ::unlink(slot->path.c_str());
      break;
    }
    pool.dir = dir;
    pool.slots.push_back(std::move(slot));
    ++kept;
  }
  return kept;
}

void SnapshotSlots::adopt_standby_slots() {
  StandbyPool& pool = standby_pool();
  std::lock_guard<std::mutex> lock(pool.mu);
  for (auto& slot : pool.slots) {
    const std::string path = next_slot_path();
    if (::rename(slot->path.c_str(), path.c_str()) != 0) {  // another filesystem, say
      ::unlink(slot->path.c_str());
      continue;
    }
    slot->path = path;
    spares_.push_back(std::move(slot));
    ++slots_adopted_;
  }
  pool.slots.clear();
  if (!pool.dir.empty()) ::rmdir(pool.dir.c_str());  // empty by now, unless still preparing
}

SnapshotSlots::SnapshotSlots(std::string dir, checkpoint::Checkpoint& ckpt,
                             SnapshotSlotsOptions options)
    : dir_(std::move(dir)), ckpt_(ckpt), options_(std::move(options)) {
  DTRAIN_CHECK(options_.max_to_keep > 0, "SnapshotSlots: max_to_keep must be positive, got ",
               options_.max_to_keep);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw_file_error(ec.value(), "create directory", dir_);
  const std::string lock = (fs::path(dir_) / kSnapshotLockFile).string();
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lock_fd_ < 0) throw_file_error(errno, "create lock file", lock);
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(lock_fd_);
    lock_fd_ = -1;
    if (err != EWOULDBLOCK) throw_file_error(err, "lock", lock);
    throw FailedPreconditionError(
        str_cat("snapshot directory ", dir_, " is in use: another process holds its lock ", lock));
  }
  // A predecessor's snapshots that only its slots' trailers hold get their files, then its slots
  // go (the files keep the bytes of the whole ones).
  materialize_journal_locked(dir_, options_.name);
  remove_leftovers(dir_, options_.name);
  adopt_standby_slots();
  // A predecessor's committed snapshots stay listed and are dropped in turn, as a
  // CheckpointManager continues the retention of its state file.
  for (const ListedSnapshot& l : listed_snapshots(dir_, options_.name)) {
    const std::string prefix = prefix_of(l.step);
    if (!fs::exists(checkpoint::index_filename(prefix), ec)) continue;
    kept_.push_back(Kept{.step = l.step,
                         .prefix = prefix,
                         .timestamp = l.timestamp.value_or(unix_now()),
                         .slot = nullptr,
                         .index = {},
                         .files = true});
  }
  while (static_cast<int>(kept_.size()) > options_.max_to_keep) kept_.pop_front();
  if (options_.commit_in_background && !options_.journal) {
    thread_ = std::thread([this] { committer(); });
  }
}

SnapshotSlots::~SnapshotSlots() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();  // after the commit in flight
  }
  // The committed snapshots stay for the launcher; spare slots hold nothing.
  for (const auto& s : spares_) ::unlink(s->path.c_str());
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void SnapshotSlots::committer() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || pending_.has_value(); });
    if (!pending_) return;  // stopped, nothing in flight
    Pending p = std::move(*pending_);
    lock.unlock();
    std::exception_ptr error;
    try {
      commit(std::move(p));
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    pending_.reset();
    error_ = error;
    cv_.notify_all();
  }
}

std::exception_ptr SnapshotSlots::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  if (thread_.joinable()) cv_.wait(lock, [this] { return !pending_.has_value(); });
  return std::exchange(error_, nullptr);
}

void SnapshotSlots::flush() {
  if (std::exception_ptr error = wait_idle()) std::rethrow_exception(error);
  if (options_.journal &&
      std::any_of(kept_.begin(), kept_.end(), [](const Kept& k) { return !k.files; })) {
    commit(Pending{});
  }
}

std::string SnapshotSlots::prefix_of(int64_t step) const {
  return (fs::path(dir_) / str_cat(options_.name, "-", step)).string();
}

std::vector<std::string> SnapshotSlots::snapshots() {
  std::exception_ptr error = wait_idle();
  if (!error && options_.journal) {
    try {
      flush();
    } catch (...) {
      error = std::current_exception();
    }
  }
  if (error) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = error;  // still the next call's to throw
  }
  std::vector<std::string> out;
  for (const Kept& k : kept_) {
    if (k.files) out.push_back(k.prefix);
  }
  return out;
}

bool SnapshotSlots::matches(const checkpoint::Checkpoint::Contents& c) const {
  if (layout_.bytes == 0 || c.graph != layout_.graph || c.tensors.size() != layout_.values.size())
    return false;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const auto& [key, t] = c.tensors[i];
    const auto& [k, e] = *layout_.values[i];
    if (key != k || t.dtype() != e.dtype || !(t.shape() == e.shape)) return false;
  }
  return true;
}

void SnapshotSlots::lay_out(const checkpoint::Checkpoint::Contents& c) {
  Layout l;
  l.graph = c.graph;
  std::tie(l.graph_bytes, l.graph_crc) = string_tensor_bytes(c.graph);
  l.bytes = l.graph_bytes.size();
  checkpoint::BundleEntry& g = l.entries[std::string(checkpoint::kObjectGraphKey)];
  g.dtype = DType::kString;
  g.shape = Shape{};
  g.offset = 0;
  g.size = static_cast<int64_t>(l.graph_bytes.size());
  g.masked_crc32c = crc32c::mask(l.graph_crc);
  for (const auto& [key, t] : c.tensors) {
    DTRAIN_CHECK(t.defined() && t.dtype() != DType::kString, "SnapshotSlots: value '", key,
                 "' is undefined or holds strings");
    const auto [it, added] = l.entries.try_emplace(key);
    DTRAIN_CHECK(added, "SnapshotSlots: two values have the key '", key, "'");
    checkpoint::BundleEntry& e = it->second;
    e.dtype = t.dtype();
    e.shape = t.shape();
    e.offset = static_cast<int64_t>(l.bytes);
    e.size = static_cast<int64_t>(t.nbytes());
    l.values.push_back(it);
    l.bytes += t.nbytes();
  }
  // A CRC of 0 is left out of its entry: with every CRC nonzero the index is at its largest.
  for (auto& e : l.values) e->second.masked_crc32c = 0xffffffffu;
  l.index_capacity = checkpoint::bundle_index_bytes(1, l.entries, "SnapshotSlots").size();
  layout_ = std::move(l);
}

std::unique_ptr<SnapshotSlots::Slot> SnapshotSlots::take_spare() {
  std::unique_ptr<Slot> slot;
  if (!spares_.empty()) {
    slot = std::move(spares_.back());
    spares_.pop_back();
  } else {
    slot = std::make_unique<Slot>();
    slot->path = next_slot_path();
    slot->fd = ::open(slot->path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (slot->fd < 0) throw_file_error(errno, "create", slot->path);
    // Nobody else knows the file yet; locked until the snapshot written into it is committed.
    ::flock(slot->fd, LOCK_EX | LOCK_NB);
    ++slots_created_;
  }
  if (slot->size != slot_bytes()) {
    try {
      slot->fit(slot_bytes());
    } catch (...) {
      ::unlink(slot->path.c_str());
      throw;
    }
  }
  return slot;
}

std::string SnapshotSlots::next_slot_path() {
  return (fs::path(dir_) / str_cat(journal_slot_stem(options_.name), ::getpid(), "-", next_slot_++))
      .string();
}

size_t SnapshotSlots::slot_bytes() const {
  return journal_slot_bytes(layout_.bytes, layout_.index_capacity);
}

std::string SnapshotSlots::save(int64_t step) {
  // The previous commit: done, or its error (or one snapshots() kept) instead.
  if (std::exception_ptr error = wait_idle()) std::rethrow_exception(error);
  const std::string prefix = prefix_of(step);
  // Rewriting a kept snapshot (after a rollback): off the list first, so that no reader ever
  // takes the new bytes for the old snapshot or a torn mix for either.
  for (auto it = kept_.begin(); it != kept_.end(); ++it) {
    if (it->step != step) continue;
    Kept k = std::move(*it);
    kept_.erase(it);
    if (k.files) write_state();
    drop(std::move(k));
    break;
  }
  const checkpoint::Checkpoint::Contents c = ckpt_.contents(/*count_save=*/true);
  if (!matches(c)) lay_out(c);
  std::unique_ptr<Slot> slot = take_spare();
  const double now = unix_now();
  std::string index;
  try {
    journal_begin(slot->map, slot->size);
    // The one pass over the state: each value straight into the slot's pages, with its CRC.
    std::memcpy(slot->map, layout_.graph_bytes.data(), layout_.graph_bytes.size());
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      const Tensor& t = c.tensors[i].second;
      checkpoint::BundleEntry& e = layout_.values[i]->second;
      // One pass: the CRC is taken of the words loaded for the copy, which streams past the
      // cache (nothing in this process reads the slot again).
      e.masked_crc32c = crc32c::mask(crc32c::extend_copy(
          0, slot->map + static_cast<size_t>(e.offset), t.raw_data(), t.nbytes()));
    }
    index = checkpoint::bundle_index_bytes(1, layout_.entries, "SnapshotSlots");
    // Whole from here on, for any reader of the trailer.
    journal_publish(slot->map, slot->size, step, now, layout_.bytes, index);
  } catch (...) {
    ::unlink(slot->path.c_str());
    throw;
  }
  ::flock(slot->fd, LOCK_UN);  // readers may hold it from now on
  kept_.push_back(Kept{.step = step,
                       .prefix = prefix,
                       .timestamp = now,
                       .slot = std::move(slot),
                       .index = std::move(index),
                       .files = false});
  Pending p;
  while (static_cast<int>(kept_.size()) > options_.max_to_keep) {
    p.doomed.push_back(std::move(kept_.front()));
    kept_.pop_front();
  }
  if (options_.journal) {
    // No files to make: only the dropped snapshots' (made by an earlier flush()) to remove.
    if (std::any_of(p.doomed.begin(), p.doomed.end(), [](const Kept& k) { return k.files; })) {
      write_state();
    }
    for (Kept& k : p.doomed) drop(std::move(k));
    return prefix;
  }
  if (!thread_.joinable()) {
    commit(std::move(p));
    return prefix;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = std::move(p);
  }
  cv_.notify_all();
  return prefix;
}

void SnapshotSlots::commit(Pending p) {
  std::vector<int64_t> made;  // the steps whose files this commit makes
  try {
    for (Kept& k : kept_) {
      if (k.files) continue;
      made.push_back(k.step);
      // Data and index first; the state file names them only then.
      link_snapshot_files(k.prefix, k.slot->path, k.index);
      k.files = true;
      k.index.clear();
    }
    write_state();
  } catch (...) {
    // Not listed: the previous state file stands. The new snapshots go, the dropped ones stay.
    for (auto it = kept_.begin(); it != kept_.end();) {
      if (std::find(made.begin(), made.end(), it->step) == made.end()) {
        ++it;
        continue;
      }
      Kept k = std::move(*it);
      it = kept_.erase(it);
      k.files = true;  // whatever of them exists goes
      drop(std::move(k));
    }
    for (auto it = p.doomed.rbegin(); it != p.doomed.rend(); ++it) {
      kept_.push_front(std::move(*it));
    }
    throw;
  }
  for (Kept& k : p.doomed) drop(std::move(k));
}

void SnapshotSlots::drop(Kept k) {
  std::error_code ec;
  if (k.files) {
    // The index first: without it the snapshot is gone for every reader.
    fs::remove(checkpoint::index_filename(k.prefix), ec);
    fs::remove(checkpoint::data_filename(k.prefix, 0, 1), ec);
  }
  if (!k.slot) return;
  // A spare only if no reader holds it (a shared flock) and no pin links it. Otherwise they keep
  // its bytes, and only its name goes.
  Slot& s = *k.slot;
  struct stat st {};
  if (::flock(s.fd, LOCK_EX | LOCK_NB) == 0 && ::fstat(s.fd, &st) == 0 && st.st_nlink == 1) {
    journal_begin(s.map, s.size);  // no longer whole for a reader of its trailer
    spares_.push_back(std::move(k.slot));
    return;
  }
  ::unlink(s.path.c_str());
}

void SnapshotSlots::write_state() {
  std::vector<std::pair<std::string, double>> names;
  for (const Kept& k : kept_) {
    if (k.files) names.emplace_back(fs::path(k.prefix).filename().string(), k.timestamp);
  }
  write_snapshot_state(dir_, names);
}

}  // namespace dtrain::train
