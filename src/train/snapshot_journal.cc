// A snapshot slot's trailer (snapshot_journal.h).
#include "snapshot_journal.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>

#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/file.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMagic = 0x316c6e6a6e727464ull;  // "dtrnjnl1"

struct Header {
  uint64_t magic;
  uint64_t seq;  // odd: being written; even and nonzero: a whole snapshot; 0: never written
  int64_t step;
  double timestamp;
  uint64_t data_bytes;
  uint64_t index_offset;
  uint64_t index_bytes;
  uint32_t crc;  // of the fields above but `seq`, then the index's bytes
  uint32_t reserved;
};
static_assert(sizeof(Header) == kJournalHeaderBytes);

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

uint32_t header_crc(const Header& h, const char* index) {
  Header copy = h;
  copy.seq = 0;
  copy.crc = 0;
  return crc32c::extend(crc32c::extend(0, &copy, sizeof copy), index, h.index_bytes);
}

bool pread_all(int fd, void* into, size_t n, off_t at) {
  return pread_full(fd, into, n, at) == static_cast<int64_t>(n);
}

// The step of snapshot file name `<name>-<step>`, or nullopt.
std::optional<int64_t> step_of(const std::string& file, const std::string& name) {
  const std::string own = name + "-";
  if (file.rfind(own, 0) != 0) return std::nullopt;
  int64_t step = 0;
  const char* begin = file.data() + own.size();
  const char* end = file.data() + file.size();
  const auto [ptr, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || ptr != end || ptr == begin) return std::nullopt;
  return step;
}

}  // namespace

std::string journal_slot_stem(const std::string& name) { return str_cat(".", name, "-slot-"); }

size_t journal_slot_bytes(size_t data_bytes, size_t index_capacity) {
  return round_up(data_bytes, 64) + round_up(index_capacity, 64) + kJournalHeaderBytes;
}

size_t journal_index_capacity(size_t slot_bytes, size_t data_bytes) {
  const size_t used = round_up(data_bytes, 64) + kJournalHeaderBytes;
  return slot_bytes > used ? slot_bytes - used : 0;
}

void journal_begin(uint8_t* map, size_t size) {
  DTRAIN_CHECK(size >= kJournalHeaderBytes, "journal: a slot of ", size, " bytes");
  auto* h = reinterpret_cast<Header*>(map + size - kJournalHeaderBytes);
  std::atomic_ref<uint64_t> seq(h->seq);
  const uint64_t s = seq.load(std::memory_order_relaxed);
  if (s % 2 == 0) seq.store(s + 1, std::memory_order_relaxed);
  // Visible before any of the data's stores, the streamed (non-temporal) ones included.
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void journal_publish(uint8_t* map, size_t size, int64_t step, double timestamp, size_t data_bytes,
                     const std::string& index) {
  DTRAIN_CHECK(index.size() <= journal_index_capacity(size, data_bytes), "journal: an index of ",
               index.size(), " bytes does not fit a slot of ", size, " bytes");
  auto* h = reinterpret_cast<Header*>(map + size - kJournalHeaderBytes);
  const size_t index_offset = round_up(data_bytes, 64);
  std::memcpy(map + index_offset, index.data(), index.size());
  Header fields{};
  fields.magic = kMagic;
  fields.step = step;
  fields.timestamp = timestamp;
  fields.data_bytes = data_bytes;
  fields.index_offset = index_offset;
  fields.index_bytes = index.size();
  fields.crc = header_crc(fields, index.data());
  std::atomic_ref<uint64_t> seq(h->seq);
  const uint64_t s = seq.load(std::memory_order_relaxed);
  fields.seq = s;  // odd: journal_begin() marked it
  std::memcpy(h, &fields, sizeof fields);
  // The data (streamed stores included) and the trailer before the even number.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  seq.store(s + 1, std::memory_order_release);
}

std::optional<JournalRecord> read_journal(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kJournalHeaderBytes)) {
    return std::nullopt;
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  const off_t at = static_cast<off_t>(size - kJournalHeaderBytes);
  Header h{};
  if (!pread_all(fd, &h, sizeof h, at)) return std::nullopt;
  if (h.magic != kMagic || h.seq == 0 || h.seq % 2 != 0 || h.data_bytes > h.index_offset ||
      h.index_offset > size - kJournalHeaderBytes ||
      h.index_bytes > size - kJournalHeaderBytes - h.index_offset) {
    return std::nullopt;
  }
  JournalRecord r{
      .step = h.step, .timestamp = h.timestamp, .data_bytes = h.data_bytes, .index = {}};
  r.index.resize(h.index_bytes);
  if (!pread_all(fd, r.index.data(), r.index.size(), static_cast<off_t>(h.index_offset))) {
    return std::nullopt;
  }
  uint64_t seq_after = 0;
  if (!pread_all(fd, &seq_after, sizeof seq_after, at + offsetof(Header, seq))) return std::nullopt;
  // Rewritten while read (a live writer), or torn: not a whole snapshot.
  if (seq_after != h.seq || header_crc(h, r.index.data()) != h.crc) return std::nullopt;
  return r;
}

std::vector<JournaledSnapshot> journaled_snapshots(const std::string& dir,
                                                   const std::string& name) {
  std::vector<JournaledSnapshot> out;
  const std::string stem = journal_slot_stem(name);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().rfind(stem, 0) != 0) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // dropped meanwhile
    std::optional<JournalRecord> r = read_journal(fd);
    ::close(fd);
    if (r) out.push_back({.slot = e.path().string(), .record = std::move(*r)});
  }
  std::sort(out.begin(), out.end(), [](const JournaledSnapshot& a, const JournaledSnapshot& b) {
    return a.record.step < b.record.step;
  });
  return out;
}

std::vector<ListedSnapshot> listed_snapshots(const std::string& dir, const std::string& name) {
  std::ifstream state(fs::path(dir) / kSnapshotStateFile);
  static const std::regex path_line(
      R"re(\s*all_model_checkpoint_paths:\s*"(?:.*/)?([^/"]+)"\s*)re");
  static const std::regex time_line(R"re(\s*all_model_checkpoint_timestamps:\s*(\S+)\s*)re");
  std::vector<std::string> names;
  std::vector<double> times;
  std::string line;
  while (std::getline(state, line)) {
    std::smatch m;
    if (std::regex_match(line, m, path_line)) {
      names.push_back(m[1].str());
    } else if (std::regex_match(line, m, time_line)) {
      times.push_back(std::strtod(m[1].str().c_str(), nullptr));
    }
  }
  std::vector<ListedSnapshot> out;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::optional<int64_t> step = step_of(names[i], name);
    if (!step) continue;
    out.push_back({.step = *step,
                   .file = names[i],
                   .timestamp = i < times.size() ? std::optional<double>(times[i]) : std::nullopt});
  }
  return out;
}

std::vector<int64_t> snapshot_steps(const std::string& dir, const std::string& name) {
  std::vector<int64_t> out;
  // The slots first: a writer that makes a slot's files keeps the slot, so a snapshot is never
  // in neither place.
  for (const JournaledSnapshot& j : journaled_snapshots(dir, name)) out.push_back(j.record.step);
  for (const ListedSnapshot& l : listed_snapshots(dir, name)) out.push_back(l.step);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::optional<JournalRecord> read_whole(int fd, int64_t step) {
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) return std::nullopt;  // being written or reused
  std::optional<JournalRecord> r = read_journal(fd);
  if (!r || r->step != step) return std::nullopt;
  return r;
}

std::optional<JournaledBytes> read_journaled(const std::string& dir, const std::string& name,
                                             int64_t step) {
  for (const JournaledSnapshot& j : journaled_snapshots(dir, name)) {
    if (j.record.step != step) continue;
    const int fd = ::open(j.slot.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::nullopt;  // dropped meanwhile
    std::optional<JournaledBytes> out;
    // Under the lock the trailer read is the one of the bytes read.
    if (std::optional<JournalRecord> r = read_whole(fd, step)) {
      JournaledBytes b{.slot = j.slot, .index = std::move(r->index), .data = {}};
      b.data.resize(r->data_bytes);
      if (pread_all(fd, b.data.data(), b.data.size(), 0)) out = std::move(b);
    }
    ::close(fd);
    return out;
  }
  return std::nullopt;
}

void link_snapshot_files(const std::string& prefix, const std::string& slot,
                         const std::string& index) {
  const std::string data = checkpoint::data_filename(prefix, 0, 1);
  if (::unlink(data.c_str()) != 0 && errno != ENOENT) throw_file_error(errno, "remove", data);
  if (::link(slot.c_str(), data.c_str()) != 0) throw_file_error(errno, "link", data);
  write_file_atomically(checkpoint::index_filename(prefix), index,
                        AtomicFileOptions{.sync = false});
}

void write_snapshot_state(const std::string& dir,
                          const std::vector<std::pair<std::string, double>>& names) {
  // CheckpointManager's text format (checkpoint_state.h): paths relative to the directory.
  const auto number = [](double v) {
    char buf[32];
    return std::string(buf, std::to_chars(buf, buf + sizeof buf, v).ptr);  // shortest exact
  };
  std::string out =
      str_cat("model_checkpoint_path: \"", names.empty() ? "" : names.back().first, "\"\n");
  for (const auto& [n, t] : names) out += str_cat("all_model_checkpoint_paths: \"", n, "\"\n");
  for (const auto& [n, t] : names) {
    out += str_cat("all_model_checkpoint_timestamps: ", number(t), "\n");
  }
  const double oldest =
      names.empty()
          ? std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count()
          : names.front().second;
  out += str_cat("last_preserved_timestamp: ", number(oldest), "\n");
  write_file_atomically((fs::path(dir) / kSnapshotStateFile).string(), out,
                        AtomicFileOptions{.sync = false});
}

void materialize_journal_locked(const std::string& dir, const std::string& name) {
  const std::vector<JournaledSnapshot> slots = journaled_snapshots(dir, name);
  if (slots.empty()) return;
  std::map<int64_t, std::pair<std::string, double>> by_step;
  for (const ListedSnapshot& l : listed_snapshots(dir, name)) {
    by_step[l.step] = {l.file, l.timestamp.value_or(0)};
  }
  bool changed = false;
  for (const JournaledSnapshot& j : slots) {
    const std::string file = str_cat(name, "-", j.record.step);
    const std::string prefix = (fs::path(dir) / file).string();
    // Made already (listed, its data file this slot, its index there): an earlier call's work,
    // or the writer's own.
    struct stat slot_st {};
    struct stat data_st {};
    if (by_step.count(j.record.step) != 0 && ::stat(j.slot.c_str(), &slot_st) == 0 &&
        ::stat(checkpoint::data_filename(prefix, 0, 1).c_str(), &data_st) == 0 &&
        slot_st.st_ino == data_st.st_ino && slot_st.st_dev == data_st.st_dev &&
        ::access(checkpoint::index_filename(prefix).c_str(), F_OK) == 0) {
      continue;
    }
    // A slot's snapshot is newer than a listed one of its step: a listed step is rewritten only
    // after it is taken off the list.
    link_snapshot_files(prefix, j.slot, j.record.index);
    by_step[j.record.step] = {file, j.record.timestamp};
    changed = true;
  }
  if (!changed) return;
  std::vector<std::pair<std::string, double>> names;
  for (auto& [step, entry] : by_step) names.push_back(std::move(entry));
  write_snapshot_state(dir, names);
}

bool materialize_journal(const std::string& dir, const std::string& name) {
  const std::string lock = (fs::path(dir) / kSnapshotLockFile).string();
  const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return true;  // never written by a SnapshotSlots
    throw_file_error(errno, "open lock file", lock);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return false;
  }
  try {
    materialize_journal_locked(dir, name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return true;
}

}  // namespace dtrain::train
