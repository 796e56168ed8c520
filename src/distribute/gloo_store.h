// A gloo::rendezvous::Store over any dtrain KeyValueStore, so a Gloo context can be built from
// the coordination service, a file store, Redis or the in-memory store. Private to
// src/distribute (Gloo headers stay out of public headers). Thread-safe if the store is.
#pragma once

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "dtrain/distribute/key_value_store.h"

namespace dtrain::distribute {

class GlooStoreAdapter final : public gloo::rendezvous::Store {
 public:
  GlooStoreAdapter(std::shared_ptr<KeyValueStore> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::string_view(data.data(), data.size()));
  }
  std::vector<char> get(const std::string& key) override {
    const std::string v = store_->get(key, timeout_);
    return std::vector<char>(v.begin(), v.end());
  }
  void wait(const std::vector<std::string>& keys) override { store_->wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    store_->wait(keys, timeout.count() > 0 ? timeout : timeout_);
  }

 private:
  std::shared_ptr<KeyValueStore> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace dtrain::distribute
