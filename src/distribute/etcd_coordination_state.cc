// The coordination state in etcd (see etcd_coordination_state.h).
#include "distribute/etcd_coordination_state.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "distribute/etcd_store.h"
#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// A day is longer than any rendezvous should wait, and far from overflow.
Clock::time_point deadline_after(milliseconds timeout) {
  return Clock::now() + std::clamp(timeout, milliseconds(0), milliseconds(std::chrono::hours(24)));
}

std::string join_names(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

// Polls at 1 ms, backing off to 20 ms: waits are short at first (rendezvous keys arrive within
// milliseconds) and cheap later.
class Poll {
 public:
  void pause() {
    std::this_thread::sleep_for(next_);
    next_ = std::min(next_ * 2, milliseconds(20));
  }

 private:
  milliseconds next_{1};
};

struct PendingRound {
  int max = 0;
  int min = 0;
  std::set<std::string> members;
};

PendingRound parse_pending(const std::string& text) {
  PendingRound p;
  const json j = json::parse(text.empty() ? "{}" : text, nullptr, false);
  if (!j.is_object()) return p;
  p.max = j.value("max", 0);
  p.min = j.value("min", 0);
  if (j.contains("members")) {
    for (const auto& m : j["members"]) p.members.insert(m.get<std::string>());
  }
  return p;
}

std::string dump_pending(const PendingRound& p) {
  if (p.members.empty()) return "{}";
  return json{{"max", p.max}, {"min", p.min}, {"members", p.members}}.dump();
}

Membership parse_membership(const std::string& text) {
  Membership m;
  const json j = json::parse(text.empty() ? "{}" : text, nullptr, false);
  if (!j.is_object()) return m;
  m.generation = j.value("generation", int64_t{0});
  if (j.contains("members")) m.members = j["members"].get<std::vector<std::string>>();
  return m;
}

std::string dump_membership(const Membership& m) {
  return json{{"generation", m.generation}, {"members", m.members}}.dump();
}

class EtcdCoordinationState final : public CoordinationBackend {
 public:
  EtcdCoordinationState(std::vector<HostPort> endpoints, std::string prefix)
      : store_(std::move(endpoints),
               // Calls give up soon enough that a launcher cut off from etcd notices within its
               // own RPC deadline (it treats that as having lost the service).
               EtcdStoreOptions{.connect_timeout = std::chrono::seconds(5),
                                .rpc_timeout = std::chrono::seconds(2),
                                .retry_window = std::chrono::seconds(3)}),
        prefix_(std::move(prefix)),
        k_pending_(prefix_ + "round/pending"),
        k_current_(prefix_ + "round/current") {
    std::random_device rd;
    nonce_ = str_cat(::getpid(), "-", rd(), "-", rd());
    watcher_ = std::thread([this] { watch_heartbeats(); });
  }
  ~EtcdCoordinationState() override {
    stop();
    watcher_.join();
  }

  void set(const std::string& key, std::string value) override {
    check_running();
    store_.set(kv(key), value);
  }

  std::string get(const std::string& key, milliseconds timeout) override {
    const auto deadline = deadline_after(timeout);
    for (Poll poll;; poll.pause()) {
      check_running();
      if (auto v = store_.try_get(kv(key))) return *v;
      if (Clock::now() >= deadline) {
        throw DeadlineExceededError(
            str_cat("coordination get: key '", key, "' not set within ", timeout.count(), " ms"));
      }
    }
  }

  int64_t add(const std::string& key, int64_t delta) override {
    check_running();
    try {
      return store_.add(kv(key), delta);
    } catch (const InvalidArgumentError&) {
      throw InvalidArgumentError(
          str_cat("coordination add: key '", key, "' holds a value that is not a decimal integer"));
    }
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    std::vector<std::string> full;
    for (const auto& k : keys) full.push_back(kv(k));
    const auto deadline = deadline_after(timeout);
    for (Poll poll;; poll.pause()) {
      check_running();
      if (store_.check(full)) return;
      if (Clock::now() >= deadline) {
        for (size_t i = 0; i < keys.size(); ++i) {
          if (!store_.try_get(full[i])) {
            throw DeadlineExceededError(str_cat("coordination wait: key '", keys[i],
                                                "' not set within ", timeout.count(), " ms"));
          }
        }
        return;  // the last one arrived just now
      }
    }
  }

  void barrier(const std::string& name, int count, milliseconds timeout) override {
    DTRAIN_CHECK(count >= 1, "coordination barrier '", name, "': count must be >= 1, got ", count);
    const std::string k = prefix_ + "barrier/" + name;
    const auto deadline = deadline_after(timeout);
    int64_t round = 0;
    for (;;) {  // arrive
      check_running();
      const auto b = store_.read(k);
      json j = json::parse(b.value.empty() ? "{}" : b.value, nullptr, false);
      if (!j.is_object()) j = json::object();
      const int arrived = j.value("arrived", 0);
      round = j.value("round", int64_t{0});
      if (arrived > 0 && j.value("count", count) != count) {
        throw InvalidArgumentError(str_cat("coordination barrier '", name, "': called with count ",
                                           count, " while ", arrived, " caller(s) wait with count ",
                                           j.value("count", 0)));
      }
      const bool last = arrived + 1 == count;
      const json next = {
          {"count", count}, {"arrived", last ? 0 : arrived + 1}, {"round", round + (last ? 1 : 0)}};
      if (store_.commit_if({{k, b.mod_revision}}, {{k, next.dump()}})) {
        if (last) return;
        break;
      }
    }
    for (Poll poll;; poll.pause()) {
      const auto b = store_.read(k);
      const json j = json::parse(b.value.empty() ? "{}" : b.value, nullptr, false);
      const int64_t now_round = j.is_object() ? j.value("round", int64_t{0}) : 0;
      if (now_round != round) return;  // completed, even if we are also stopping or late
      if (!stopped_ && Clock::now() < deadline) continue;
      // Leave the round (unless it completed meanwhile).
      const int arrived = j.is_object() ? j.value("arrived", 0) : 0;
      json left = j;
      left["arrived"] = std::max(0, arrived - 1);
      if (!store_.commit_if({{k, b.mod_revision}}, {{k, left.dump()}})) continue;
      check_running();
      throw DeadlineExceededError(str_cat("coordination barrier '", name, "': ", arrived, " of ",
                                          count, " arrived within ", timeout.count(), " ms"));
    }
  }

  int64_t heartbeat(const std::string& task) override {
    check_running();
    const std::string beat = str_cat(nonce_, ":", beats_.fetch_add(1));
    store_.set(prefix_ + "hb/" + task, beat);
    {
      std::lock_guard lock(mu_);
      seen_beats_.insert_or_assign(task, std::make_pair(beat, Clock::now()));
    }
    return parse_membership(store_.read(k_current_).value).generation;
  }

  std::map<std::string, milliseconds> heartbeat_ages() const override {
    observe_heartbeats();
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
    std::map<std::string, milliseconds> ages;
    for (const auto& [task, seen] : seen_beats_) {
      ages[task] = std::chrono::duration_cast<milliseconds>(now - seen.second);
    }
    return ages;
  }

  Membership join(const std::string& member, const JoinOptions& options) override {
    const int count = options.max_members;
    const int min_count = options.min_members == 0 ? count : options.min_members;
    DTRAIN_CHECK(count >= 1, "coordination join: count must be >= 1, got ", count);
    DTRAIN_CHECK(min_count >= 1 && min_count <= count, "coordination join: min_members ",
                 options.min_members, " is not in [1, ", count, "]");
    DTRAIN_CHECK(!member.empty(), "coordination join: empty member id");
    const auto deadline = deadline_after(options.timeout);
    const auto settle =
        std::clamp(options.settle, milliseconds(0), milliseconds(std::chrono::hours(1)));
    int64_t target = 0;
    for (;;) {  // enter the round being formed
      check_running();
      const auto cur = store_.read(k_current_);
      const auto pend = store_.read(k_pending_);
      PendingRound p = parse_pending(pend.value);
      if (!p.members.empty() && (p.max != count || p.min != min_count)) {
        throw InvalidArgumentError(str_cat("coordination join: '", member, "' expects ", min_count,
                                           "..", count,
                                           " members but the round being formed expects ", p.min,
                                           "..", p.max, " (", join_names(p.members), ")"));
      }
      p.max = count;
      p.min = min_count;
      p.members.insert(member);
      target = parse_membership(cur.value).generation + 1;
      if (store_.commit_if({{k_current_, cur.mod_revision}, {k_pending_, pend.mod_revision}},
                           {{k_pending_, dump_pending(p)}})) {
        break;
      }
    }
    int64_t seen_revision = -1;
    auto seen_at = Clock::now();
    std::set<std::string> joined;
    for (Poll poll;; poll.pause()) {
      const auto cur = store_.read(k_current_);
      if (parse_membership(cur.value).generation >= target) {
        const auto round = store_.read(round_key(target));
        Membership m = parse_membership(round.value);
        DTRAIN_INTERNAL_CHECK(m.generation == target, "membership round ", target,
                              " missing from etcd");
        return m;
      }
      const auto pend = store_.read(k_pending_);
      const PendingRound p = parse_pending(pend.value);
      joined = p.members;
      const auto now = Clock::now();
      if (pend.mod_revision != seen_revision) {  // someone arrived (or left): settle again
        seen_revision = pend.mod_revision;
        seen_at = now;
      }
      const int n = static_cast<int>(p.members.size());
      if (n >= count || (n >= min_count && now >= seen_at + settle)) {
        Membership m{.generation = target, .members = {p.members.begin(), p.members.end()}};
        if (store_.commit_if({{k_current_, cur.mod_revision}, {k_pending_, pend.mod_revision}},
                             {{round_key(target), dump_membership(m)},
                              {k_current_, dump_membership(m)},
                              {k_pending_, "{}"}})) {
          return m;
        }
        continue;  // someone changed the round first: look again
      }
      if (stopped_ || now >= deadline) break;
    }
    for (;;) {  // leave the round
      const auto pend = store_.read(k_pending_);
      PendingRound p = parse_pending(pend.value);
      if (!p.members.count(member)) break;
      p.members.erase(member);
      if (store_.commit_if({{k_pending_, pend.mod_revision}}, {{k_pending_, dump_pending(p)}})) {
        break;
      }
    }
    check_running();
    throw DeadlineExceededError(str_cat("coordination join: ", joined.size(), " of ", count,
                                        " members joined generation ", target, " within ",
                                        options.timeout.count(), " ms (", join_names(joined), ")"));
  }

  Membership membership() const override {
    Membership m = parse_membership(store_.read(k_current_).value);
    const PendingRound p = parse_pending(store_.read(k_pending_).value);
    m.joining.assign(p.members.begin(), p.members.end());
    return m;
  }

  std::map<std::string, std::string> get_prefix(const std::string& prefix) const override {
    check_running();
    std::map<std::string, std::string> out;
    const size_t strip = kv("").size();
    for (auto& [k, v] : store_.get_prefix(kv(prefix))) out.emplace(k.substr(strip), v);
    return out;
  }

  void stop() override {
    {
      std::lock_guard lock(mu_);
      stopped_ = true;
    }
    stop_cv_.notify_all();
  }

 private:
  // Reads every heartbeat; a beat whose value changed since the last read is fresh now.
  void observe_heartbeats() const {
    const std::string hb = prefix_ + "hb/";
    const auto beats = store_.get_prefix(hb);
    const auto now = Clock::now();
    std::lock_guard lock(mu_);
    for (const auto& [key, value] : beats) {
      const std::string task = key.substr(hb.size());
      auto it = seen_beats_.find(task);
      if (it == seen_beats_.end() || it->second.first != value) {
        seen_beats_.insert_or_assign(task, std::make_pair(value, now));
      }
    }
  }

  // Other services' beats are seen changing within kWatchPeriod, however rarely this service
  // is asked for the ages.
  void watch_heartbeats() {
    static constexpr milliseconds kWatchPeriod{100};
    std::unique_lock lock(mu_);
    while (!stopped_) {
      lock.unlock();
      try {
        observe_heartbeats();
      } catch (const Error&) {
        // etcd unreachable for now: the ages grow, which is what a lost service looks like.
      }
      lock.lock();
      stop_cv_.wait_for(lock, kWatchPeriod, [&] { return stopped_.load(); });
    }
  }

  void check_running() const {
    if (stopped_) throw UnavailableError("coordination service is shutting down");
  }
  std::string kv(const std::string& key) const { return prefix_ + "kv/" + key; }
  std::string round_key(int64_t generation) const {
    return str_cat(prefix_, "round/g", generation);
  }

  mutable EtcdKeyValueStore store_;  // thread-safe; const methods read through it
  const std::string prefix_;
  const std::string k_pending_;
  const std::string k_current_;
  std::string nonce_;  // tells this service's beats from a restarted one's
  std::atomic<uint64_t> beats_{0};
  std::atomic<bool> stopped_{false};
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;  // wakes the watcher at stop()
  // Per task: the last beat value seen and when it was first seen; guarded by mu_.
  mutable std::map<std::string, std::pair<std::string, Clock::time_point>> seen_beats_;
  std::thread watcher_;  // watch_heartbeats(), until stop()
};

}  // namespace

std::unique_ptr<CoordinationBackend> make_etcd_coordination_state(const std::string& url,
                                                                  const std::string& prefix) {
  return std::make_unique<EtcdCoordinationState>(parse_etcd_url(url), prefix);
}

}  // namespace dtrain::distribute
