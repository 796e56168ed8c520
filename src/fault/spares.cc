// Hot spares (see spares.h).
#include "fault/spares.h"

#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <map>
#include <nlohmann/json.hpp>

#include "dtrain/core/error.h"
#include "dtrain/train/standby.h"
#include "fault/failure_classifier.h"

namespace dtrain::fault {
namespace {

constexpr milliseconds kReadyCheckPeriod(250);
constexpr int kMaxDeadBeforeReady = 3;

FaultEvent spare_event(const char* kind, int64_t generation, int id, pid_t pid) {
  FaultEvent e;
  e.kind = kind;
  e.generation = generation;
  e.pid = pid;
  e.extra["spare"] = std::to_string(id);
  return e;
}

}  // namespace

Spares::Spares(SparesOptions options, distribute::CoordinationClient& client,
               FaultRecorder& recorder)
    : o_(std::move(options)), client_(client), recorder_(recorder) {}

Spares::~Spares() {
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
  return static_cast<int>(
      std::count_if(standby_.begin(), standby_.end(), [](const Spare& s) { return s.ready; }));
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
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
        pump(*streams[i].first, *streams[i].second);
      }
    }
  }
  reap(generation);
  const bool unready =
      std::any_of(standby_.begin(), standby_.end(), [](const Spare& s) { return !s.ready; });
  if (unready && Clock::now() >= next_ready_check_) refresh_ready(generation);
  while (!gave_up_ && static_cast<int>(standby_.size()) < o_.count) start_one(generation);
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
  s.prefix = str_cat("[spare ", id, "] ");
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
  for (auto it = standby_.begin(); it != standby_.end();) {
    int status = 0;
    if (::waitpid(it->process.pid, &status, WNOHANG) != it->process.pid) {
      ++it;
      continue;
    }
    for (Stream* st : {&it->process.out, &it->process.err}) close_stream(*st, it->prefix);
    ::kill(-it->process.pid, SIGKILL);  // whatever of its process group is left
    FaultEvent e = spare_event(kEventSpareLost, generation, it->id, it->process.pid);
    e.exit_code = exit_code_of(status);
    if (WIFSIGNALED(status)) e.signal = WTERMSIG(status);
    e.extra["ready"] = it->ready ? "true" : "false";
    e.message = str_cat("spare ", it->id, " (pid ", it->process.pid, ") ", describe_exit(status),
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
  if (std::none_of(standby_.begin(), standby_.end(), [](const Spare& s) { return s.ready; })) {
    refresh_ready(generation);  // one may have become ready since the last look
  }
  const auto it =
      std::find_if(standby_.begin(), standby_.end(), [](const Spare& s) { return s.ready; });
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
