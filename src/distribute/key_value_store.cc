// KeyValueStore's default wait (polling check()), the in-memory store and the prefix view.
#include "dtrain/distribute/key_value_store.h"

#include <charconv>
#include <thread>

#include "dtrain/core/error.h"

namespace dtrain::distribute {
namespace {

std::string join_keys(std::span<const std::string> keys) {
  std::string s;
  for (const auto& k : keys) {
    if (!s.empty()) s += ", ";
    s += "'" + k + "'";
  }
  return s;
}

int64_t parse_counter(const std::string& key, const std::string& value) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (ec != std::errc() || end != value.data() + value.size()) {
    throw InvalidArgumentError(
        str_cat("KeyValueStore::add: key '", key, "' holds '", value, "', not an integer"));
  }
  return v;
}

}  // namespace

void KeyValueStore::wait(std::span<const std::string> keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  while (!check(keys)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      throw DeadlineExceededError(str_cat(describe(), ": timed out after ", timeout.count(),
                                          " ms waiting for key(s) ", join_keys(keys)));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(10));
  }
}

void InMemoryKeyValueStore::set(const std::string& key, std::string_view value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    values_[key] = std::string(value);
  }
  changed_.notify_all();
}

std::string InMemoryKeyValueStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!changed_.wait_for(lock, timeout, [&] { return values_.count(key) > 0; })) {
    throw DeadlineExceededError(str_cat(describe(), ": timed out after ", timeout.count(),
                                        " ms waiting for key '", key, "'"));
  }
  return values_.at(key);
}

int64_t InMemoryKeyValueStore::add(const std::string& key, int64_t delta) {
  int64_t v = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = values_.find(key);
    if (it != values_.end()) v = parse_counter(key, it->second);
    v += delta;
    values_[key] = std::to_string(v);
  }
  changed_.notify_all();
  return v;
}

bool InMemoryKeyValueStore::check(std::span<const std::string> keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& k : keys) {
    if (!values_.count(k)) return false;
  }
  return true;
}

void InMemoryKeyValueStore::wait(std::span<const std::string> keys,
                                 std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  auto all_set = [&] {
    for (const auto& k : keys) {
      if (!values_.count(k)) return false;
    }
    return true;
  };
  if (!changed_.wait_for(lock, timeout, all_set)) {
    std::vector<std::string> missing;
    for (const auto& k : keys) {
      if (!values_.count(k)) missing.push_back(k);
    }
    throw DeadlineExceededError(str_cat(describe(), ": timed out after ", timeout.count(),
                                        " ms waiting for key(s) ", join_keys(missing)));
  }
}

size_t InMemoryKeyValueStore::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return values_.size();
}

PrefixKeyValueStore::PrefixKeyValueStore(std::shared_ptr<KeyValueStore> base, std::string prefix)
    : base_(std::move(base)), prefix_(std::move(prefix)) {
  DTRAIN_CHECK(base_ != nullptr, "PrefixKeyValueStore: base store is null");
}

std::vector<std::string> PrefixKeyValueStore::prefixed(std::span<const std::string> keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const auto& k : keys) out.push_back(prefix_ + k);
  return out;
}

void PrefixKeyValueStore::set(const std::string& key, std::string_view value) {
  base_->set(prefix_ + key, value);
}

std::string PrefixKeyValueStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  return base_->get(prefix_ + key, timeout);
}

int64_t PrefixKeyValueStore::add(const std::string& key, int64_t delta) {
  return base_->add(prefix_ + key, delta);
}

bool PrefixKeyValueStore::check(std::span<const std::string> keys) {
  return base_->check(prefixed(keys));
}

void PrefixKeyValueStore::wait(std::span<const std::string> keys,
                               std::chrono::milliseconds timeout) {
  base_->wait(prefixed(keys), timeout);
}

std::string PrefixKeyValueStore::describe() const { return base_->describe(); }

}  // namespace dtrain::distribute
