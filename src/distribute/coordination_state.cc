// The coordination service's state machine; see coordination_state.h. Thread-safe (one mutex).
#include "distribute/coordination_state.h"

#include <algorithm>
#include <charconv>

#include "dtrain/core/error.h"

namespace dtrain::distribute {

int Membership::index_of(const std::string& member) const {
  const auto it = std::find(members.begin(), members.end(), member);
  return it == members.end() ? -1 : static_cast<int>(it - members.begin());
}

namespace {

constexpr size_t kRoundsKept = 64;  // completed membership rounds remembered for late waiters

std::string join_names(const std::set<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

}  // namespace

CoordinationState::Clock::time_point CoordinationState::deadline_after(
    std::chrono::milliseconds timeout) {
  // A day is longer than any rendezvous should wait, and far from overflow.
  const auto capped = std::clamp(timeout, std::chrono::milliseconds(0),
                                 std::chrono::milliseconds(std::chrono::hours(24)));
  return Clock::now() + capped;
}

void CoordinationState::check_running() const {
  if (stopped_) throw UnavailableError("coordination service is shutting down");
}

void CoordinationState::set(const std::string& key, std::string value) {
  {
    std::lock_guard lock(mu_);
    check_running();
    values_[key] = std::move(value);
  }
  changed_.notify_all();
}

std::string CoordinationState::get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return stopped_ || values_.count(key) > 0; });
  check_running();
  const auto it = values_.find(key);
  if (it == values_.end()) {
    throw DeadlineExceededError(
        str_cat("coordination get: key '", key, "' not set within ", timeout.count(), " ms"));
  }
  return it->second;
}

int64_t CoordinationState::add(const std::string& key, int64_t delta) {
  int64_t result = 0;
  {
    std::lock_guard lock(mu_);
    check_running();
    std::string& value = values_[key];
    int64_t current = 0;
    if (!value.empty()) {
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), current);
      if (ec != std::errc() || end != value.data() + value.size()) {
        throw InvalidArgumentError(str_cat("coordination add: key '", key,
                                           "' holds a value that is not a decimal integer (",
                                           value.size(), " bytes)"));
      }
    }
    result = current + delta;
    value = std::to_string(result);
  }
  changed_.notify_all();
  return result;
}

void CoordinationState::wait(const std::vector<std::string>& keys,
                             std::chrono::milliseconds timeout) {
  const auto deadline = deadline_after(timeout);
  const auto missing = [&]() -> const std::string* {
    for (const auto& k : keys) {
      if (values_.count(k) == 0) return &k;
    }
    return nullptr;
  };
  std::unique_lock lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return stopped_ || missing() == nullptr; });
  check_running();
  if (const std::string* k = missing()) {
    throw DeadlineExceededError(
        str_cat("coordination wait: key '", *k, "' not set within ", timeout.count(), " ms"));
  }
}

void CoordinationState::barrier(const std::string& name, int count,
                                std::chrono::milliseconds timeout) {
  DTRAIN_CHECK(count >= 1, "coordination barrier '", name, "': count must be >= 1, got ", count);
  const auto deadline = deadline_after(timeout);
  std::unique_lock lock(mu_);
  check_running();
  BarrierState& b = barriers_[name];
  if (b.arrived > 0 && b.count != count) {
    throw InvalidArgumentError(str_cat("coordination barrier '", name, "': called with count ",
                                       count, " while ", b.arrived, " caller(s) wait with count ",
                                       b.count));
  }
  b.count = count;
  const uint64_t round = b.round;
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.round;
    lock.unlock();
    changed_.notify_all();
    return;
  }
  changed_.wait_until(lock, deadline, [&] { return stopped_ || b.round != round; });
  if (b.round != round) return;  // completed, even if we are also stopping or late
  const int arrived = b.arrived--;
  check_running();
  throw DeadlineExceededError(str_cat("coordination barrier '", name, "': ", arrived, " of ", count,
                                      " arrived within ", timeout.count(), " ms"));
}

int64_t CoordinationState::heartbeat(const std::string& task) {
  std::lock_guard lock(mu_);
  check_running();
  heartbeats_[task] = Clock::now();
  return generation_;
}

std::map<std::string, std::chrono::milliseconds> CoordinationState::heartbeat_ages() const {
  std::lock_guard lock(mu_);
  const auto now = Clock::now();
  std::map<std::string, std::chrono::milliseconds> ages;
  for (const auto& [task, at] : heartbeats_) {
    ages[task] = std::chrono::duration_cast<std::chrono::milliseconds>(now - at);
  }
  return ages;
}

Membership CoordinationState::join(const std::string& member, const JoinOptions& options) {
  const int count = options.max_members;
  const int min_count = options.min_members == 0 ? count : options.min_members;
  DTRAIN_CHECK(count >= 1, "coordination join: count must be >= 1, got ", count);
  DTRAIN_CHECK(min_count >= 1 && min_count <= count, "coordination join: min_members ",
               options.min_members, " is not in [1, ", count, "]");
  DTRAIN_CHECK(!member.empty(), "coordination join: empty member id");
  const auto deadline = deadline_after(options.timeout);
  std::unique_lock lock(mu_);
  check_running();
  if (!pending_.empty() && (pending_count_ != count || pending_min_ != min_count)) {
    throw InvalidArgumentError(str_cat("coordination join: '", member, "' expects ", min_count,
                                       "..", count, " members but the round being formed expects ",
                                       pending_min_, "..", pending_count_, " (",
                                       join_names(pending_), ")"));
  }
  pending_count_ = count;
  pending_min_ = min_count;
  pending_settle_ = std::chrono::duration_cast<Clock::duration>(
      std::clamp(options.settle, std::chrono::milliseconds(0),
                 std::chrono::milliseconds(std::chrono::hours(1))));
  pending_.insert(member);
  last_arrival_ = Clock::now();
  const int64_t target = generation_ + 1;
  changed_.notify_all();  // waiters of an elastic round restart their settle time
  while (true) {
    if (generation_ >= target) {
      const auto it = rounds_.find(target);
      DTRAIN_INTERNAL_CHECK(it != rounds_.end(), "membership round ", target, " forgotten");
      return it->second;
    }
    const int n = static_cast<int>(pending_.size());
    const auto now = Clock::now();
    if (n == count || (n >= min_count && now >= last_arrival_ + pending_settle_)) {
      Membership m{.generation = target, .members = {pending_.begin(), pending_.end()}};
      rounds_[target] = m;
      while (rounds_.size() > kRoundsKept) rounds_.erase(rounds_.begin());
      generation_ = target;
      pending_.clear();
      pending_count_ = 0;
      pending_min_ = 0;
      lock.unlock();
      changed_.notify_all();
      return m;
    }
    if (stopped_ || now >= deadline) break;
    auto wake = deadline;
    if (n >= min_count) wake = std::min(wake, last_arrival_ + pending_settle_);
    changed_.wait_until(lock, wake);
  }
  const std::string joined = join_names(pending_);
  const size_t n = pending_.size();
  pending_.erase(member);
  if (pending_.empty()) pending_count_ = pending_min_ = 0;
  check_running();
  throw DeadlineExceededError(str_cat("coordination join: ", n, " of ", count,
                                      " members joined generation ", target, " within ",
                                      options.timeout.count(), " ms (", joined, ")"));
}

Membership CoordinationState::membership() const {
  std::lock_guard lock(mu_);
  const auto it = rounds_.find(generation_);
  Membership m = it == rounds_.end() ? Membership{} : it->second;
  m.joining.assign(pending_.begin(), pending_.end());
  return m;
}

std::map<std::string, std::string> CoordinationState::get_prefix(const std::string& prefix) const {
  std::lock_guard lock(mu_);
  check_running();
  std::map<std::string, std::string> out;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it) {
    out.emplace(it->first, it->second);
  }
  return out;
}

void CoordinationState::stop() {
  {
    std::lock_guard lock(mu_);
    stopped_ = true;
  }
  changed_.notify_all();
}

}  // namespace dtrain::distribute
