// Hot spares (see spares.h).
#include "fault/spares.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/train/standby.h"
#include "fault/failure_classifier.h"

namespace dtrain::fault {
namespace {

constexpr milliseconds kReadyCheckPeriod(250);
// A stopped spare is fenced at its second sighting, 250–500 ms after the stop: one sighting
// could be a debugger's or strace's momentary stop.
constexpr milliseconds kStopCheckPeriod(250);
constexpr int kMaxDeadBeforeReady = 3;

FaultEvent spare_event(const char* kind, int64_t generation, int id, pid_t pid) {
  FaultEvent e;
  e.kind = kind;
  e.generation = generation;
  e.pid = pid;
  e.extra["spare"] = std::to_string(id);
  return e;
}

// The spares' and their fork server's prefixes on the launcher's output.
std::string spare_prefix(int id) { return str_cat("[spare ", id, "] "); }
const std::string kServerPrefix = "[spare fork server] ";

FaultEvent fork_server_event(const char* state, int64_t generation, pid_t pid) {
  FaultEvent e;
  e.kind = kEventSpareForkServer;
  e.generation = generation;
  e.pid = pid;
  e.extra["state"] = state;
  return e;
}

}  // namespace

Spares::Spares(SparesOptions options, distribute::CoordinationClient& client,
               FaultRecorder& recorder)
    : o_(std::move(options)), client_(client), recorder_(recorder) {}

Spares::~Spares() {
  if (server_) stop_fork_server(0, "", nullptr);
  for (Spare& s : standby_) ::kill(-s.process.pid, SIGKILL);
  for (Spare& s : standby_) {
    ::waitpid(s.process.pid, nullptr, 0);
    for (Stream* st : {&s.process.out, &s.process.err}) close_stream(*st, s.prefix);
  }
}

std::string Spares::key(int id) const { return str_cat(prefix(), id); }

std::string Spares::prefix() const {
  return str_cat("dtrain/", o_.run_id, "/launch/spares/n", o_.node, "/");
}

int Spares::ready() const {
  return static_cast<int>(std::count_if(standby_.begin(), standby_.end(),
                                        [](const Spare& s) { return s.ready && !s.fenced; }));
}

void Spares::tend(int64_t generation) {
  // Output: what arrived, without waiting (the launcher's loop waits on the workers' pipes).
  std::vector<pollfd> fds;
  std::vector<std::pair<Stream*, const std::string*>> streams;
  for (Spare& s : standby_) {
    for (Stream* st : {&s.process.out, &s.process.err}) {
      if (st->fd < 0) continue;
      fds.push_back({.fd = st->fd, .events = POLLIN, .revents = 0});
      streams.emplace_back(st, &s.prefix);
    }
  }
  if (server_) {
    for (Stream* st : {&server_->process.out, &server_->process.err}) {
      if (st->fd < 0) continue;
      fds.push_back({.fd = st->fd, .events = POLLIN, .revents = 0});
      streams.emplace_back(st, &kServerPrefix);
    }
  }
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        pump(*streams[i].first, *streams[i].second);
      }
    }
  }
  if (server_) read_fork_server(generation);
  if (Clock::now() >= next_stop_check_) fence_stopped(generation);
  reap(generation);
  const bool unready =
      std::any_of(standby_.begin(), standby_.end(), [](const Spare& s) { return !s.ready; });
  if (unready && Clock::now() >= next_ready_check_) refresh_ready(generation);
  while (!gave_up_ && static_cast<int>(standby_.size()) < o_.count) {
    if (o_.fork_server && !fork_failed_ && (server_ || start_fork_server(generation))) {
      // One request at a time; its answer comes in a later call.
      if (server_->ready && !server_->pending) request_fork(generation);
      break;
    }
    start_one(generation);
  }
}

bool Spares::start_fork_server(int64_t generation) {
  const auto fail = [&](const std::string& why) {
    say("spares: cannot start the fork server (", why, "); starting each spare on its own");
    fork_failed_ = true;
    return false;
  };
  // The forked spares' parent exits at once: the launcher adopts them.
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) {
    return fail(str_cat("PR_SET_CHILD_SUBREAPER: ", std::strerror(errno)));
  }
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return fail(str_cat("socketpair: ", std::strerror(errno)));
  }
  std::vector<std::string> drop = o_.worker_variables;
  drop.insert(drop.end(), {train::kEnvSpare, train::kEnvSpareService, train::kEnvSpareKey,
                           train::kEnvSpareForkFd});
  std::vector<std::string> set = o_.set;
  set.push_back(str_cat(train::kEnvSpare, "=", train::kSpareForkServer));
  set.push_back(str_cat(train::kEnvSpareService, "=", o_.service));
  set.push_back(str_cat(train::kEnvSpareForkFd, "=", sv[1]));
  ForkServer f;
  f.started = Clock::now();
  try {
    f.process =
        spawn_process(o_.command, environment_with(drop, set), "the spares' fork server", sv[1]);
  } catch (const Error& e) {
    ::close(sv[0]);
    ::close(sv[1]);
    return fail(e.what());
  }
  ::close(sv[1]);
  f.socket = sv[0];
  FaultEvent e = fork_server_event("started", generation, f.process.pid);
  e.message = str_cat("started the spares' fork server (pid ", f.process.pid, ")");
  recorder_.record(e);
  server_ = std::move(f);
  return true;
}

void Spares::request_fork(int64_t generation) {
  const int id = next_id_++;
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) {
    stop_fork_server(generation, str_cat("pipe: ", std::strerror(errno)), "lost");
    return;
  }
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    stop_fork_server(generation, str_cat("pipe: ", std::strerror(errno)), "lost");
    return;
  }
  const std::string text = str_cat("fork ", id, " ", key(id));
  iovec iov{.iov_base = const_cast<char*>(text.data()), .iov_len = text.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  const int fds[2] = {out[1], err[1]};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  ssize_t n;
  do {
    n = ::sendmsg(server_->socket, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  const int send_errno = errno;
  ::close(out[1]);
  ::close(err[1]);
  if (n != static_cast<ssize_t>(text.size())) {
    ::close(out[0]);
    ::close(err[0]);
    stop_fork_server(generation, str_cat("sendmsg: ", std::strerror(send_errno)), "lost");
    return;
  }
  Spare s;
  s.id = id;
  s.prefix = spare_prefix(id);
  s.started = Clock::now();
  s.process.out = {.fd = out[0], .out = STDOUT_FILENO, .partial = {}};
  s.process.err = {.fd = err[0], .out = STDERR_FILENO, .partial = {}};
  server_->pending = std::move(s);
}

void Spares::read_fork_server(int64_t generation) {
  while (server_) {
    char buf[4096];
    ssize_t n;
    do {
      n = ::recv(server_->socket, buf, sizeof buf - 1, MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n <= 0) return;  // the server is gone: reap() notices
    buf[n] = '\0';
    const std::string text(buf, static_cast<size_t>(n));
    int id = -1;
    long pid = -1;
    if (text.rfind("ready ", 0) == 0) {
      server_->ready = true;
      const double took = seconds_between(server_->started, Clock::now());
      FaultEvent e = fork_server_event("ready", generation, server_->process.pid);
      e.extra["ready_seconds"] = fixed(took, 3);
      e.message =
          str_cat("the spares' fork server (pid ", server_->process.pid,
                  ") stands by (data loaded, model built) ", fixed(took, 2), " s after its start");
      recorder_.record(e);
    } else if (text.rfind("refused ", 0) == 0) {  // "refused <why>"
      stop_fork_server(generation, text.substr(8), "refused");
      return;
    } else if (std::sscanf(buf, "spare %d %ld", &id, &pid) == 2 && server_->pending &&
               server_->pending->id == id && pid > 0) {
      Spare s = std::move(*server_->pending);
      server_->pending.reset();
      s.process.pid = static_cast<pid_t>(pid);
      FaultEvent e = spare_event(kEventSpareStarted, generation, id, s.process.pid);
      e.extra["from"] = "fork-server";
      e.message =
          str_cat("started spare ", id, " (pid ", s.process.pid, ", forked by the fork ",
                  "server in ", fixed(seconds_between(s.started, Clock::now()) * 1e3, 1), " ms)");
      recorder_.record(e);
      standby_.push_back(std::move(s));
    } else {
      stop_fork_server(generation, str_cat("its answer '", text, "'"), "lost");
    }
  }
}

void Spares::stop_fork_server(int64_t generation, const std::string& why, const char* state) {
  ForkServer& f = *server_;
  ::close(f.socket);  // the server exits at EOF
  if (!f.exited) {
    ::kill(-f.process.pid, SIGKILL);
    ::waitpid(f.process.pid, nullptr, 0);
  }
  for (Stream* st : {&f.process.out, &f.process.err}) close_stream(*st, kServerPrefix);
  if (f.pending) {
    for (Stream* st : {&f.pending->process.out, &f.pending->process.err}) ::close(st->fd);
  }
  if (state != nullptr) {  // not the destructor
    FaultEvent e = fork_server_event(state, generation, f.process.pid);
    e.message = str_cat("the spares' fork server (pid ", f.process.pid, ") ",
                        std::string(state) == "refused" ? "refused: " : "is lost: ", why,
                        "; each spare is started on its own from now on");
    say(e.message);
    recorder_.record(e);
  }
  server_.reset();
  fork_failed_ = true;
}

void Spares::start_one(int64_t generation) {
  const int id = next_id_++;
  std::vector<std::string> drop = o_.worker_variables;
  drop.insert(drop.end(), {train::kEnvSpare, train::kEnvSpareService, train::kEnvSpareKey});
  std::vector<std::string> set = o_.set;
  set.push_back(str_cat(train::kEnvSpare, "=", id));
  set.push_back(str_cat(train::kEnvSpareService, "=", o_.service));
  set.push_back(str_cat(train::kEnvSpareKey, "=", key(id)));
  Spare s;
  s.id = id;
  s.prefix = spare_prefix(id);
  s.started = Clock::now();
  try {
    s.process = spawn_process(o_.command, environment_with(drop, set), str_cat("spare ", id));
  } catch (const Error& e) {
    say("spares: cannot start spare ", id, " (", e.what(), "); not starting more");
    gave_up_ = true;
    return;
  }
  FaultEvent e = spare_event(kEventSpareStarted, generation, id, s.process.pid);
  e.message = str_cat("started spare ", id, " (pid ", s.process.pid, ")");
  recorder_.record(e);
  standby_.push_back(std::move(s));
}

void Spares::reap(int64_t generation) {
  if (server_) {
    int status = 0;
    if (::waitpid(server_->process.pid, &status, WNOHANG) == server_->process.pid) {
      server_->exited = true;
      stop_fork_server(generation, describe_exit(status), "lost");
    }
  }
  for (auto it = standby_.begin(); it != standby_.end();) {
    int status = 0;
    const pid_t r = ::waitpid(it->process.pid, &status, WNOHANG);
    if (r == -1 && errno == ECHILD) {
      status = 0;  // a forked spare not adopted by this launcher: lost, its status unknown
    } else if (r != it->process.pid) {
      ++it;
      continue;
    }
    for (Stream* st : {&it->process.out, &it->process.err}) close_stream(*st, it->prefix);
    ::kill(-it->process.pid, SIGKILL);  // whatever of its process group is left
    FaultEvent e = spare_event(kEventSpareLost, generation, it->id, it->process.pid);
    e.exit_code = exit_code_of(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    e.extra["ready"] = it->ready ? "true" : "false";
    if (it->fenced) e.extra["fenced"] = "true";
    e.message = str_cat("spare ", it->id, " (pid ", it->process.pid, ") ",
                        it->fenced ? "was stopped and is fenced (killed)" : describe_exit(status),
                        it->ready ? " while standing by" : " before it stood by",
                        gave_up_ ? "" : "; starting another (not a worker failure)");
    say(e.message);
    recorder_.record(e);
    died_unready_ = it->ready ? 0 : died_unready_ + 1;
    it = standby_.erase(it);
    if (died_unready_ >= kMaxDeadBeforeReady && !gave_up_) {
      gave_up_ = true;
      say("spares: ", kMaxDeadBeforeReady, " spares in a row died before they stood by; not ",
          "starting more (failed workers are restarted instead)");
    }
  }
}

void Spares::fence_stopped(int64_t generation) {
  next_stop_check_ = Clock::now() + kStopCheckPeriod;
  if (server_ && !server_->exited) {
    const bool stopped = process_stopped(server_->process.pid);
    if (stopped && server_seen_stopped_) {
      server_seen_stopped_ = false;
      stop_fork_server(generation, "it was stopped (SIGSTOP?); killed", "lost");
    } else {
      server_seen_stopped_ = stopped;
    }
  }
  for (Spare& s : standby_) {
    if (s.fenced) continue;
    const bool stopped = process_stopped(s.process.pid);
    if (stopped && s.seen_stopped) {
      // SIGKILL ends a stopped process too; reap() records it and starts another.
      ::kill(-s.process.pid, SIGKILL);
      s.fenced = true;
    }
    s.seen_stopped = stopped;
  }
}

void Spares::refresh_ready(int64_t generation) {
  next_ready_check_ = Clock::now() + kReadyCheckPeriod;
  std::map<std::string, std::string> keys;
  try {
    keys = client_.get_prefix(prefix());
  } catch (const Error& e) {
    say("spares: cannot read which spares stand by: ", e.what());
    return;
  }
  for (Spare& s : standby_) {
    if (s.ready || keys.find(key(s.id) + "/ready") == keys.end()) continue;
    s.ready = true;
    died_unready_ = 0;
    const double took = seconds_between(s.started, Clock::now());
    FaultEvent e = spare_event(kEventSpareReady, generation, s.id, s.process.pid);
    e.extra["ready_seconds"] = fixed(took, 3);
    e.message = str_cat("spare ", s.id, " (pid ", s.process.pid, ") stands by (data loaded, ",
                        "model built, connected) ", fixed(took, 2), " s after its start");
    recorder_.record(e);
  }
}

std::optional<Spares::Taken> Spares::take(int rank, int64_t generation,
                                          const std::vector<std::string>& unset,
                                          const std::vector<std::string>& set) {
  reap(generation);
  // Neither a fenced spare nor one stopped right now (it would hold the generation up until its
  // heartbeats time out).
  const auto usable = [](const Spare& s) {
    return s.ready && !s.fenced && !process_stopped(s.process.pid);
  };
  if (std::none_of(standby_.begin(), standby_.end(), usable)) {
    refresh_ready(generation);  // one may have become ready since the last look
  }
  const auto it = std::find_if(standby_.begin(), standby_.end(), usable);
  if (it == standby_.end()) return std::nullopt;
  const nlohmann::json j = {
      {"rank", rank}, {"generation", generation}, {"unset", unset}, {"set", set}};
  try {
    client_.set(key(it->id) + "/assign", j.dump());
  } catch (const Error& e) {
    say("spares: cannot assign rank ", rank, " to spare ", it->id, " (", e.what(), ")");
    return std::nullopt;
  }
  Taken t{.spare = it->id, .process = it->process};
  emit_lines(t.process.out, it->prefix, false);
  emit_lines(t.process.err, it->prefix, false);
  FaultEvent e = spare_event(kEventSpareTakeover, generation, it->id, it->process.pid);
  e.rank = rank;
  e.message = str_cat("spare ", it->id, " (pid ", it->process.pid, ") takes over rank ", rank,
                      " in generation ", generation);
  say(e.message);
  recorder_.record(e);
  standby_.erase(it);
  return t;
}

}  // namespace dtrain::fault
