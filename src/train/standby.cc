// A hot spare's wait for its rank (dtrain/train/standby.h).
#include "dtrain/train/standby.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "memory_snapshots.h"
#include "snapshot_journal.h"
#include "snapshot_slots.h"

namespace dtrain::train {
namespace {

// One wait on the service; a spare waits again after it (the launcher kills its spares when it
// exits, and the kernel does when it dies: PR_SET_PDEATHSIG).
constexpr std::chrono::hours kWaitChunk(1);

std::string required(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    throw InvalidArgumentError(
        str_cat("standby: ", name, " is not set (", kEnvSpare, " is; the launcher sets both)"));
  }
  return v;
}

// `text`, the value of variable `name`, as an integer >= 0; InvalidArgumentError saying it is
// not `what` otherwise.
int non_negative_int(const char* name, const std::string& text, const char* what) {
  try {
    size_t used = 0;
    const int v = std::stoi(text, &used);
    if (used == text.size() && v >= 0) return v;
  } catch (const std::exception&) {
  }
  throw InvalidArgumentError(str_cat("standby: ", name, "='", text, "' is not ", what));
}

// The threads of this process other than the calling one, by name (/proc/self/task/*/comm);
// nullopt when /proc cannot be read.
std::optional<std::vector<std::string>> other_threads() {
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return std::nullopt;
  std::vector<std::string> names;
  const std::string self = std::to_string(::gettid());
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.' || self == e->d_name) continue;
    std::string name;
    std::ifstream(str_cat("/proc/self/task/", e->d_name, "/comm")) >> name;
    names.push_back(name.empty() ? std::string(e->d_name) : name);
  }
  ::closedir(d);
  return names;
}

void send_text(int fd, const std::string& text) {
  ssize_t n;
  do {
    n = ::send(fd, text.data(), text.size(), MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
}

// One request of the launcher: "fork <id> <key>" with two descriptors (the spare's stdout and
// stderr). Returns false at EOF (the launcher is done or gone). Throws DataLossError for
// anything else.
bool receive_fork_request(int fd, int& id, std::string& key, int& out, int& err) {
  char buf[4096];
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  iovec iov{.iov_base = buf, .iov_len = sizeof buf - 1};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do {
    n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE))) return false;
  if (n < 0) throw DataLossError(str_cat("fork server: recvmsg: ", std::strerror(errno)));
  buf[n] = '\0';
  out = err = -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS &&
        c->cmsg_len == CMSG_LEN(2 * sizeof(int))) {
      int fds[2];
      std::memcpy(fds, CMSG_DATA(c), sizeof fds);
      out = fds[0];
      err = fds[1];
    }
  }
  char k[4000];
  if (std::sscanf(buf, "fork %d %3999s", &id, k) != 2 || out < 0 || (msg.msg_flags & MSG_CTRUNC)) {
    throw DataLossError(str_cat("fork server: the launcher's request '", buf,
                                "' is not 'fork <id> <key>' with two descriptors"));
  }
  key = k;
  return true;
}

// The forked spare, child of the launcher now: its own process group, SIGKILL when the
// launcher dies, its own output pipes and its identity. Waits until `intermediate` (the spare's
// first parent) has exited; exits when it was not re-parented to the launcher (the launcher is
// gone, or is no subreaper).
void become_spare(pid_t launcher, pid_t intermediate, int id, const std::string& key, int out,
                  int err) {
  // The intermediate exits right after the fork (microseconds); the bound is only a safety net.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (::getppid() == intermediate && std::chrono::steady_clock::now() < deadline) ::usleep(100);
  if (::getppid() == intermediate) {
    std::fprintf(stderr,
                 "standby: spare %d was not re-parented to the launcher (pid %d) within 10 s of "
                 "its fork; it exits\n",
                 id, static_cast<int>(launcher));
    ::_exit(1);
  }
  if (::getppid() != launcher) ::_exit(1);
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || ::getppid() != launcher) ::raise(SIGKILL);
  ::setpgid(0, 0);
  if (::dup2(out, STDOUT_FILENO) < 0 || ::dup2(err, STDERR_FILENO) < 0) ::_exit(1);
  ::close(out);
  ::close(err);
  ::setenv(kEnvSpare, std::to_string(id).c_str(), 1);
  ::setenv(kEnvSpareKey, key.c_str(), 1);
  ::unsetenv(kEnvSpareForkFd);
}

// The fork server's loop (standby.h): returns only in a forked spare.
void serve_spare_forks(const std::string& fd_text) {
  const int fd = non_negative_int(kEnvSpareForkFd, fd_text, "a file descriptor");
  const pid_t launcher = ::getppid();
  // A first fork runs the libraries' fork handlers: OpenBLAS's stops its thread pool (restarted
  // by the next BLAS call, which this process never makes). Threads nobody stops remain.
  if (const pid_t probe = ::fork(); probe == 0) {
    ::_exit(0);
  } else if (probe > 0) {
    ::waitpid(probe, nullptr, 0);
  }
  const auto threads = other_threads();
  if (!threads || !threads->empty()) {
    std::string names;
    for (const std::string& n : threads.value_or(std::vector<std::string>{})) {
      names += str_cat(names.empty() ? "" : ", ", n);
    }
    send_text(fd, threads
                      ? str_cat("refused this process runs ", threads->size(), " other thread(s) (",
                                names, ") where it would fork, and a fork copies one")
                      : std::string("refused /proc/self/task cannot be read"));
    ::_exit(0);
  }
  send_text(fd, str_cat("ready ", ::getpid()));
  std::cerr << "standby: fork server " << ::getpid()
            << " is ready (data loaded, model built); forking spares on request\n";
  while (true) {
    int id = 0, out = -1, err = -1;
    std::string key;
    if (!receive_fork_request(fd, id, key, out, err)) ::_exit(0);
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);  // no buffered byte is written twice
    int pid_pipe[2];
    if (::pipe2(pid_pipe, O_CLOEXEC) != 0) {
      send_text(fd, str_cat("failed ", id, " pipe: ", std::strerror(errno)));
      ::close(out);
      ::close(err);
      continue;
    }
    const pid_t intermediate = ::fork();
    if (intermediate == 0) {
      // A double fork: the spare's parent exits at once, so the launcher (a child subreaper)
      // becomes the spare's parent. The spare is told its first parent's pid: asking getppid()
      // after the fork races with that parent's exit, and a spare re-parented already would
      // take the launcher for the intermediate and wait out become_spare's bound.
      const pid_t self = ::getpid();
      const pid_t spare = ::fork();
      if (spare == 0) {
        ::close(pid_pipe[0]);
        ::close(pid_pipe[1]);
        ::close(fd);
        become_spare(launcher, self, id, key, out, err);
        return;
      }
      [[maybe_unused]] const ssize_t w = ::write(pid_pipe[1], &spare, sizeof spare);
      ::_exit(spare < 0 ? 1 : 0);
    }
    const int fork_errno = errno;
    ::close(pid_pipe[1]);
    ::close(out);
    ::close(err);
    pid_t spare = -1;
    if (intermediate > 0) {
      ssize_t n;
      do {
        n = ::read(pid_pipe[0], &spare, sizeof spare);
      } while (n < 0 && errno == EINTR);
      if (n != sizeof spare) spare = -1;
      ::waitpid(intermediate, nullptr, 0);  // the spare is re-parented once this returns
    }
    ::close(pid_pipe[0]);
    if (spare > 0) {
      send_text(fd, str_cat("spare ", id, " ", spare));
    } else {
      send_text(fd, str_cat("failed ", id,
                            " fork: ", std::strerror(intermediate < 0 ? fork_errno : EAGAIN)));
    }
  }
}

// Set when the assignment arrives: the slot-preparing thread makes no more slots.
std::atomic<bool> g_assigned{false};

// The largest snapshot slot or data file in the workers' directories under `root` (the size of
// a worker's snapshot of this job); 0 when there is none yet.
size_t largest_snapshot_data(const std::string& root) {
  namespace fs = std::filesystem;
  static const std::string kData = ".data-00000-of-00001";
  static const std::string kSlot = journal_slot_stem(kMemorySnapshotName);
  size_t largest = 0;
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(root, ec)) {
    if (!d.is_directory(ec)) continue;
    for (const auto& f : fs::directory_iterator(d.path(), ec)) {
      const std::string n = f.path().filename().string();
      const bool data =
          n.size() > kData.size() && n.compare(n.size() - kData.size(), kData.size(), kData) == 0;
      if (!data && n.rfind(kSlot, 0) != 0) continue;
      const auto bytes = f.file_size(ec);
      if (!ec) largest = std::max(largest, static_cast<size_t>(bytes));
    }
  }
  return largest;
}

// A spare's first snapshot slots (SnapshotSlots::prepare_standby_slots), made on a thread of
// their own at nice 19 while the spare waits (where the workers fill every CPU the thread gets
// about 1.5% of one: its 10-odd ms of work take the workers little; SCHED_IDLE would take
// nothing but may never run on a busy machine), and taken over by its first SnapshotSlots after
// the assignment. Nothing when the job takes no in-memory snapshots, none exists yet (the spare
// started with the job), or tmpfs has less than twice the room free.
void prepare_snapshot_slots(int id) {
  const char* root = std::getenv(kEnvSpareSlotRoot);
  if (root == nullptr || *root == '\0') return;
  const size_t bytes = largest_snapshot_data(root);
  const int count = kSnapshotsKept + 1;
  struct statvfs fs {};
  if (bytes == 0 || ::statvfs(root, &fs) != 0 ||
      static_cast<double>(fs.f_bavail) * fs.f_frsize < 2.0 * count * bytes) {
    return;
  }
  const std::string dir = str_cat(root, "/.spare-", id, "-", ::getpid());
  std::thread([dir, bytes, count] {
    ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 19);  // this thread only
    try {
      SnapshotSlots::prepare_standby_slots(dir, bytes, count, &g_assigned);
    } catch (const Error& e) {
      std::cerr << "standby: no snapshot slots made ahead: " << e.what() << "\n";
    }
  }).detach();
}

}  // namespace

bool is_standby() {
  const char* v = std::getenv(kEnvSpare);
  return v != nullptr && *v != '\0';
}

std::optional<StandbyAssignment> await_standby_assignment() {
  if (!is_standby()) return std::nullopt;
  if (const char* fork_fd = std::getenv(kEnvSpareForkFd); fork_fd != nullptr && *fork_fd != '\0') {
    serve_spare_forks(fork_fd);  // returns in each forked spare, as that spare
  }
  const std::string id_text = required(kEnvSpare);
  const int id = non_negative_int(kEnvSpare, id_text, "a spare id (an integer >= 0)");
  const std::string service = required(kEnvSpareService);
  const std::string key = required(kEnvSpareKey);
  StandbyAssignment a{.spare = id};
  prepare_snapshot_slots(id);
  std::vector<std::string> unset, set;
  auto assigned = std::chrono::steady_clock::now();
  {
    distribute::CoordinationClient client(
        service, {.connect_timeout = std::chrono::seconds(30),
                  .rpc_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kWaitChunk) +
                                 std::chrono::seconds(30)});
    client.set(key + "/ready", std::to_string(::getpid()));
    std::cerr << "standby: spare " << id << " is ready (data loaded, model built); waiting for a "
              << "rank\n";
    std::string text;
    while (text.empty()) {
      try {
        text = client.get(key + "/assign", kWaitChunk);
        assigned = std::chrono::steady_clock::now();
      } catch (const DeadlineExceededError&) {
        // Nobody failed for an hour: keep standing by.
      }
    }
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    try {
      a.rank = j.at("rank").get<int>();
      a.generation = j.at("generation").get<int64_t>();
      unset = j.at("unset").get<std::vector<std::string>>();
      set = j.at("set").get<std::vector<std::string>>();
    } catch (const std::exception&) {
      throw DataLossError(str_cat("standby: the launcher's assignment ", key, "/assign = '", text,
                                  "' is not {\"rank\", \"generation\", \"unset\", \"set\"}"));
    }
  }  // the client (and its threads' use of the environment) ends before the environment changes
  // (the slot-preparing thread reads none of it)
  g_assigned = true;
  for (const std::string& name : unset) ::unsetenv(name.c_str());
  for (const std::string& kv : set) {
    const size_t eq = kv.find('=');
    DTRAIN_CHECK(eq != std::string::npos && eq > 0, "standby: the launcher's assignment sets '", kv,
                 "', not NAME=value");
    ::setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
  }
  // When the assignment arrived, for the newcomer's report of the recovery's phases
  // (memory_snapshots.h: DTRAIN_STANDBY_ASSIGNED_AT, CLOCK_MONOTONIC seconds).
  ::setenv(
      "DTRAIN_STANDBY_ASSIGNED_AT",
      std::to_string(std::chrono::duration<double>(assigned.time_since_epoch()).count()).c_str(),
      1);
  ::unsetenv(kEnvSpare);
  ::unsetenv(kEnvSpareService);
  ::unsetenv(kEnvSpareKey);
  std::cerr << "standby: spare " << id << " takes over rank " << a.rank << " in generation "
            << a.generation << "\n";
  return a;
}

}  // namespace dtrain::train
