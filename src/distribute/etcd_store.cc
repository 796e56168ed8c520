// The etcd key-value store (see etcd_store.h).
#include "distribute/etcd_store.h"

#include <algorithm>
#include <charconv>
#include <mutex>
#include <thread>

#include "distribute/grpc_settings.h"
#include "dtrain/core/error.h"
#include "etcd_kv.grpc.pb.h"

namespace dtrain::distribute {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// etcd refuses a Txn with more operations than --max-txn-ops (128 by default).
constexpr size_t kMaxTxnOps = 128;

std::string join_endpoints(const std::vector<HostPort>& endpoints) {
  std::string s;
  for (const auto& e : endpoints) s += (s.empty() ? "" : ",") + e.to_string();
  return s;
}

std::string join_keys(std::span<const std::string> keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

// The end of the range of keys that start with `prefix` (etcd's "prefix + 1"); "\0" (every key
// from `prefix` on) when the prefix is all 0xff bytes.
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(static_cast<unsigned char>(prefix.back()) + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// An unreachable or silent endpoint: try the next one. Other failures are etcd's answer.
bool endpoint_failed(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

struct EtcdKeyValueStore::Impl {
  std::vector<HostPort> endpoints;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> stubs;  // one per endpoint
  std::atomic<size_t> current{0};                              // the endpoint calls go to first
  EtcdStoreOptions options;
  std::string url;

  // Runs `rpc(stub, ctx)` on the current endpoint, failing over to the others while they are
  // unreachable, for up to `window`. Throws UnavailableError naming every endpoint tried.
  template <class Rpc>
  void call(const char* what, milliseconds window, Rpc&& rpc) {
    const auto deadline = Clock::now() + window;
    std::map<size_t, std::string> errors;  // per endpoint, the last failure
    auto pause = milliseconds(20);
    for (;;) {
      for (size_t tried = 0; tried < stubs.size(); ++tried) {
        const size_t i = current.load();
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + options.rpc_timeout);
        const grpc::Status s = rpc(*stubs[i], &ctx);
        if (s.ok()) return;
        if (!endpoint_failed(s)) {
          throw_error(static_cast<ErrorCode>(s.error_code()),
                      str_cat(url, ": ", what, ": etcd at ", endpoints[i].to_string(),
                              " said: ", s.error_message()));
        }
        errors[i] = s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                        ? str_cat("no answer within ", options.rpc_timeout.count(), " ms")
                        : s.error_message();
        size_t expected = i;  // fail over (unless another thread already did)
        current.compare_exchange_strong(expected, (i + 1) % stubs.size());
      }
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(
          std::min(pause, std::chrono::duration_cast<milliseconds>(deadline - Clock::now())));
      pause = std::min(pause * 2, milliseconds(500));
    }
    std::string why;
    for (const auto& [i, e] : errors) {
      why += str_cat(why.empty() ? "" : "; ", endpoints[i].to_string(), ": ", e);
    }
    throw UnavailableError(str_cat(url, ": ", what, ": no etcd endpoint reachable within ",
                                   window.count(), " ms (", why, ")"));
  }

  etcdserverpb::RangeResponse range(const std::string& key, const std::string& range_end,
                                    milliseconds window) {
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    if (!range_end.empty()) req.set_range_end(range_end);
    etcdserverpb::RangeResponse resp;
    call("range", window, [&](etcdserverpb::KV::Stub& stub, grpc::ClientContext* ctx) {
      return stub.Range(ctx, req, &resp);
    });
    return resp;
  }

  // The number of `keys` that are set (one Txn of Range operations per kMaxTxnOps keys).
  size_t count_present(std::span<const std::string> keys) {
    size_t present = 0;
    for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
      etcdserverpb::TxnRequest req;
      const size_t end = std::min(keys.size(), begin + kMaxTxnOps);
      for (size_t k = begin; k < end; ++k) {
        auto* r = req.add_success()->mutable_request_range();
        r->set_key(keys[k]);
        r->set_count_only(true);
      }
      etcdserverpb::TxnResponse resp;
      call("check", options.retry_window,
           [&](etcdserverpb::KV::Stub& stub, grpc::ClientContext* ctx) {
             return stub.Txn(ctx, req, &resp);
           });
      for (const auto& op : resp.responses()) present += op.response_range().count() > 0 ? 1 : 0;
    }
    return present;
  }
};

EtcdKeyValueStore::EtcdKeyValueStore(std::vector<HostPort> endpoints,
                                     const EtcdStoreOptions& options)
    : impl_(std::make_unique<Impl>()), url_("etcd://" + join_endpoints(endpoints)) {
  DTRAIN_CHECK(!endpoints.empty(), "EtcdKeyValueStore: no endpoints");
  impl_->endpoints = std::move(endpoints);
  impl_->options = options;
  impl_->url = url_;
  for (const auto& e : impl_->endpoints) {
    impl_->stubs.push_back(etcdserverpb::KV::NewStub(make_channel(e.to_string(), 1000, 2000)));
  }
  try {
    impl_->range("dtrain", "", options.connect_timeout);
  } catch (const UnavailableError& e) {
    throw UnavailableError(str_cat(url_, ": cannot connect: ", e.what()));
  }
}

EtcdKeyValueStore::~EtcdKeyValueStore() = default;

void EtcdKeyValueStore::set(const std::string& key, std::string_view value) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value.data(), value.size());
  etcdserverpb::PutResponse resp;
  impl_->call("put", impl_->options.retry_window,
              [&](etcdserverpb::KV::Stub& stub, grpc::ClientContext* ctx) {
                return stub.Put(ctx, req, &resp);
              });
}

std::optional<std::string> EtcdKeyValueStore::try_get(const std::string& key) {
  const etcdserverpb::RangeResponse resp = impl_->range(key, "", impl_->options.retry_window);
  if (resp.kvs_size() == 0) return std::nullopt;
  return resp.kvs(0).value();
}

std::string EtcdKeyValueStore::get(const std::string& key, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto pause = milliseconds(1);
  for (;;) {
    if (auto v = try_get(key)) return *v;
    if (Clock::now() >= deadline) {
      throw DeadlineExceededError(
          str_cat(url_, ": timed out after ", timeout.count(), " ms waiting for key '", key, "'"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(20));
  }
}

int64_t EtcdKeyValueStore::add(const std::string& key, int64_t delta) {
  // Compare-and-swap on the key's mod revision (0 for an absent key); a failed compare returns
  // the current value in the same round trip, and the next attempt starts from it.
  int64_t mod_revision = 0;
  int64_t current = 0;
  for (;;) {
    const int64_t next = current + delta;
    etcdserverpb::TxnRequest req;
    auto* cmp = req.add_compare();
    cmp->set_key(key);
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_mod_revision(mod_revision);
    auto* put = req.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(std::to_string(next));
    req.add_failure()->mutable_request_range()->set_key(key);
    etcdserverpb::TxnResponse resp;
    impl_->call("add", impl_->options.retry_window,
                [&](etcdserverpb::KV::Stub& stub, grpc::ClientContext* ctx) {
                  return stub.Txn(ctx, req, &resp);
                });
    if (resp.succeeded()) return next;
    // Another client changed (or deleted) the key since: read what it holds now.
    if (resp.responses_size() != 1 || resp.responses(0).response_range().kvs_size() == 0) {
      mod_revision = 0;
      current = 0;
      continue;
    }
    const auto& kv = resp.responses(0).response_range().kvs(0);
    const std::string& text = kv.value();
    int64_t v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size()) {
      throw InvalidArgumentError(
          str_cat("KeyValueStore::add: key '", key, "' holds '", text, "', not an integer"));
    }
    mod_revision = kv.mod_revision();
    current = v;
  }
}

bool EtcdKeyValueStore::check(std::span<const std::string> keys) {
  return impl_->count_present(keys) == keys.size();
}

void EtcdKeyValueStore::wait(std::span<const std::string> keys, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  auto pause = milliseconds(1);
  while (!check(keys)) {
    if (Clock::now() >= deadline) {
      std::vector<std::string> missing;
      for (const auto& k : keys) {
        if (!try_get(k)) missing.push_back(k);
      }
      throw DeadlineExceededError(str_cat(url_, ": timed out after ", timeout.count(),
                                          " ms waiting for key(s) ", join_keys(missing)));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, milliseconds(20));
  }
}

std::map<std::string, std::string> EtcdKeyValueStore::get_prefix(const std::string& prefix) {
  const etcdserverpb::RangeResponse resp =
      impl_->range(prefix, prefix_end(prefix), impl_->options.retry_window);
  std::map<std::string, std::string> out;
  for (const auto& kv : resp.kvs()) out.emplace(kv.key(), kv.value());
  return out;
}

EtcdKeyValueStore::Versioned EtcdKeyValueStore::read(const std::string& key) {
  const etcdserverpb::RangeResponse resp = impl_->range(key, "", impl_->options.retry_window);
  if (resp.kvs_size() == 0) return {};
  return {.value = resp.kvs(0).value(), .mod_revision = resp.kvs(0).mod_revision()};
}

bool EtcdKeyValueStore::commit_if(const std::vector<std::pair<std::string, int64_t>>& expected,
                                  const std::vector<std::pair<std::string, std::string>>& puts) {
  etcdserverpb::TxnRequest req;
  for (const auto& [key, revision] : expected) {
    auto* cmp = req.add_compare();
    cmp->set_key(key);
    cmp->set_target(etcdserverpb::Compare::MOD);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    cmp->set_mod_revision(revision);
  }
  for (const auto& [key, value] : puts) {
    auto* put = req.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
  }
  etcdserverpb::TxnResponse resp;
  impl_->call("txn", impl_->options.retry_window,
              [&](etcdserverpb::KV::Stub& stub, grpc::ClientContext* ctx) {
                return stub.Txn(ctx, req, &resp);
              });
  return resp.succeeded();
}

}  // namespace dtrain::distribute
