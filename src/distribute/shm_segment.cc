// ShmTransport's segment: who may share one (the same boot, pid namespace, /dev/shm and network
// namespace), its creation by rank 0 and attachment by the others through the store, the
// removal of segments that crashed runs left, and the transport's teardown.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "dtrain/core/error.h"
#include "shm_transport.h"

namespace dtrain::distribute {
namespace {

constexpr uint64_t kMagic = 0x3176686d73727464;  // "dtrshmv1"
constexpr size_t kPage = 4096;
constexpr const char* kPrefix = "dtrain-coll-";
// How long a wait spins before it blocks in the kernel (DTRAIN_SHM_SPIN_US overrides it, 0 to
// 10000): the cores may be shared, so spinning longer would take the core from the peer being
// waited for (docs/decisions.md).
constexpr int64_t kDefaultSpinMicros = 10;  // about what 256 pauses took on the AMD EPYC
size_t round_up(size_t a, size_t b) { return (a + b - 1) / b * b; }

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string namespace_of(const char* link) {
  char buf[128] = {};
  const ssize_t n = readlink(link, buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

std::string pid_namespace() { return namespace_of("/proc/self/ns/pid"); }

// Digits of "pid:[4026531836]", for segment names.
std::string namespace_digits(const std::string& ns) {
  std::string d;
  for (char c : ns) {
    if (c >= '0' && c <= '9') d += c;
  }
  return d.empty() ? "0" : d;
}

// What must match for two processes to share a segment and see each other's pids: the boot,
// the pid namespace and the /dev/shm mount (device and inode). The network namespace too: workers
// in separate ones are hosts as far as the job is told (the netns test clusters), so they keep
// the network between them.
std::string host_identity() {
  struct stat st {};
  const bool shm_ok = stat("/dev/shm", &st) == 0;
  const std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  const std::string ns = pid_namespace();
  const std::string net = namespace_of("/proc/self/ns/net");
  if (!shm_ok || boot.empty() || ns.empty()) return "";
  return str_cat(boot, "/", ns, "/", net, "/", static_cast<uint64_t>(st.st_dev), ":",
                 static_cast<uint64_t>(st.st_ino));
}

std::string sanitized(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.';
    out += ok ? c : '_';
    if (out.size() == 40) break;
  }
  return out;
}

// Unlinks segments of crashed runs: a segment lives under its name only between its creation and
// the moment every rank has mapped it, so one whose creator (same pid namespace) is gone is a
// leftover of a run that died during setup.
void remove_stale_segments(const std::string& ns_digits) {
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return;
  const std::string mine = str_cat(kPrefix, ns_digits, "-");
  while (dirent* e = readdir(dir)) {
    const std::string name = e->d_name;
    if (name.rfind(mine, 0) != 0) continue;
    const long pid = std::strtol(name.c_str() + mine.size(), nullptr, 10);
    if (pid > 0 && kill(static_cast<pid_t>(pid), 0) == -1 && errno == ESRCH) {
      shm_unlink(("/" + name).c_str());
    }
  }
  closedir(dir);
}

std::chrono::microseconds spin_from_environment() {
  const char* env = std::getenv("DTRAIN_SHM_SPIN_US");
  if (env == nullptr || *env == '\0') return std::chrono::microseconds(kDefaultSpinMicros);
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  if (*end != '\0' || v < 0 || v > 10000) {
    throw InvalidArgumentError(
        str_cat("DTRAIN_SHM_SPIN_US is '", env, "': expected microseconds from 0 to 10000"));
  }
  return std::chrono::microseconds(v);
}

}  // namespace

struct ShmTransport::Header {
  uint64_t magic;
  uint32_t world_size;
  uint32_t reserved;
  uint64_t region_bytes;
};

std::unique_ptr<ShmTransport> ShmTransport::connect(KeyValueStore& store, const ShmOptions& options,
                                                    std::string* why_not) {
  const int n = options.world_size;
  const int r = options.rank;
  const std::chrono::microseconds spin = spin_from_environment();  // a bad value throws here
  const std::string identity = host_identity();
  const bool vote = options.enabled && n >= 2 && n <= kShmMaxRanks && !identity.empty();
  store.set(str_cat("shm/host/", r), str_cat(vote ? "1" : "0", " ", ::getpid(), " ", identity));
  std::vector<int64_t> pids(n);
  std::string reason;
  for (int k = 0; k < n; ++k) {
    std::istringstream in(store.get(str_cat("shm/host/", k), options.timeout));
    std::string v, id;
    in >> v >> pids[k] >> id;
    if (!reason.empty()) continue;
    if (v != "1") {
      reason = str_cat("rank ", k, " does not use shared memory (DTRAIN_SHM_COLLECTIVES=0, ",
                       "an old-style all-reduce algorithm, more than ", kShmMaxRanks,
                       " workers, or no /dev/shm)");
    } else if (id != identity) {
      reason = str_cat("rank ", k, " is on another host (or pid namespace, or /dev/shm)");
    }
  }
  if (!reason.empty()) {
    if (why_not != nullptr) *why_not = reason;
    return nullptr;
  }

  std::unique_ptr<ShmTransport> t(new ShmTransport());
  t->options_ = options;
  t->pids_ = pids;
  t->region_bytes_ = round_up(std::clamp<size_t>(options.region_bytes, 64 << 10, 4 << 20), kPage);
  t->header_bytes_ = round_up(kShmLine + kShmLine * n, kPage);
  t->mapped_bytes_ = t->header_bytes_ + t->region_bytes_ * 2 * n;
  const std::string ns_digits = namespace_digits(pid_namespace());
  std::string name;
  bool created = false;
  auto unlink_created = [&] {
    if (created) shm_unlink(name.c_str());
    created = false;
  };
  auto map = [&](int fd) -> std::string {
    void* p = mmap(nullptr, t->mapped_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) return str_cat("mmap: ", std::strerror(errno));
    t->base_ = p;
    t->header_ = static_cast<Header*>(p);
    return "";
  };
  std::string error;
  try {
    if (r == 0) {
      remove_stale_segments(ns_digits);
      std::random_device rd;
      const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
      char hex[17];
      std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(nonce));
      name = str_cat("/", kPrefix, ns_digits, "-", ::getpid(), "-", sanitized(options.run_id), "-g",
                     options.generation, "-", hex);
      const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
      if (fd < 0) {
        error = str_cat("shm_open(", name, "): ", std::strerror(errno));
      } else {
        created = true;
        // Allocated now, not at first touch: a full /dev/shm (containers often give 64 MiB) must
        // turn the transport down here, not raise SIGBUS in the middle of a step.
        const int err = posix_fallocate(fd, 0, static_cast<off_t>(t->mapped_bytes_));
        if (err != 0) {
          error = str_cat("posix_fallocate(", name, ", ", t->mapped_bytes_,
                          " bytes): ", std::strerror(err));
          close(fd);
        } else {
          error = map(fd);
        }
      }
      if (error.empty()) {
        t->header_->world_size = static_cast<uint32_t>(n);
        t->header_->region_bytes = t->region_bytes_;
        std::atomic_ref<uint64_t>(t->header_->magic).store(kMagic, std::memory_order_release);
      }
      store.set("shm/segment", error.empty() ? name : "!" + error);
    } else {
      name = store.get("shm/segment", options.timeout);
      if (!name.empty() && name[0] == '!') {
        error = str_cat("rank 0 could not create the segment: ", name.substr(1));
      } else {
        const int fd = shm_open(name.c_str(), O_RDWR, 0);
        struct stat st {};
        if (fd < 0) {
          error = str_cat("shm_open(", name, "): ", std::strerror(errno));
        } else if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != t->mapped_bytes_) {
          error = str_cat(name, " has ", st.st_size, " bytes, expected ", t->mapped_bytes_);
          close(fd);
        } else {
          error = map(fd);
        }
        if (error.empty() &&
            (std::atomic_ref<uint64_t>(t->header_->magic).load(std::memory_order_acquire) !=
                 kMagic ||
             t->header_->world_size != static_cast<uint32_t>(n))) {
          error = str_cat(name, " is not this generation's segment");
        }
      }
    }
    store.set(str_cat("shm/attached/", r), error.empty() ? "1" : "0 " + error);
    for (int k = 0; k < n; ++k) {
      const std::string v = store.get(str_cat("shm/attached/", k), options.timeout);
      if (v != "1" && reason.empty())
        reason = str_cat("rank ", k, ": ", v.size() > 2 ? v.substr(2) : v);
    }
  } catch (...) {
    unlink_created();
    throw;
  }
  unlink_created();  // every rank has mapped it (or given up): the name is no longer needed
  if (!reason.empty()) {
    if (why_not != nullptr) *why_not = reason;
    return nullptr;  // the destructor unmaps; nobody waits on the segment
  }
  t->name_ = name;
  t->spin_ = spin;
  t->pidfds_.assign(n, -1);
  for (int k = 0; k < n; ++k) {
    if (k == r || pids[k] == ::getpid()) continue;
#ifdef SYS_pidfd_open
    t->pidfds_[k] = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(pids[k]), 0));
#endif
  }
  t->start_watcher();
  return t;
}

ShmTransport::~ShmTransport() {
  if (watcher_.joinable()) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(stop_fd_, &one, sizeof one);
    watcher_.join();
  }
  if (stop_fd_ >= 0) close(stop_fd_);
  if (base_ != nullptr) {
    abort();
    munmap(base_, mapped_bytes_);
  }
  for (int fd : pidfds_) {
    if (fd >= 0) close(fd);
  }
}

}  // namespace dtrain::distribute
