// Stores behind rendezvous URLs (Gloo's FileStore and RedisStore, extended with overwrite and
// add; etcd in etcd_store.cc) and the rendezvous protocol itself: publish PeerInfo, wait for every
// rank, check sizes.
#include "dtrain/distribute/rendezvous.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#define HIREDIS_NESTED_INCLUDE
#include <gloo/common/error.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>

#include <nlohmann/json.hpp>

#include "distribute/etcd_store.h"
#include "dtrain/core/error.h"
#include "dtrain/distribute/coordination.h"
#include "dtrain/distribute/launcher_env.h"

namespace dtrain::distribute {
namespace {

// Gloo's FileStore names each key's file by a hash of the key and writes it by rename; this
// subclass adds overwriting set (the base refuses existing keys), reads of empty values and an
// atomic add under flock(2).
class FileStore final : public gloo::rendezvous::FileStore {
 public:
  explicit FileStore(const std::string& dir) : gloo::rendezvous::FileStore(dir) {}
  using gloo::rendezvous::FileStore::check;

  void put(const std::string& key, std::string_view value) {
    std::ostringstream tmp_name;
    tmp_name << tmpPath(key) << "." << ::getpid() << "." << std::this_thread::get_id();
    const std::string tmp = tmp_name.str();
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out.write(value.data(), static_cast<std::streamsize>(value.size()));
      out.flush();
      if (!out) throw UnavailableError(str_cat("file store: cannot write ", tmp));
    }
    if (::rename(tmp.c_str(), objectPath(key).c_str()) != 0) {
      throw UnavailableError(
          str_cat("file store: rename to ", objectPath(key), " failed: ", std::strerror(errno)));
    }
  }

  std::optional<std::string> read(const std::string& key) {
    std::ifstream in(objectPath(key), std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  int64_t add(const std::string& key, int64_t delta) {
    const std::string lock_path = basePath_ + "/.dtrain_add.lock";
    const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR, 0644);
    if (fd < 0) throw UnavailableError(str_cat("file store: cannot open ", lock_path));
    ::flock(fd, LOCK_EX);
    int64_t v = 0;
    try {
      if (auto cur = read(key)) {
        try {
          size_t pos = 0;
          v = std::stoll(*cur, &pos);
          if (pos != cur->size()) throw std::invalid_argument("trailing");
        } catch (const std::exception&) {
          throw InvalidArgumentError(
              str_cat("KeyValueStore::add: key '", key, "' holds '", *cur, "', not an integer"));
        }
      }
      v += delta;
      put(key, std::to_string(v));
    } catch (...) {
      ::flock(fd, LOCK_UN);
      ::close(fd);
      throw;
    }
    ::flock(fd, LOCK_UN);
    ::close(fd);
    return v;
  }

  const std::string& base_path() const { return basePath_; }
};

class FileKeyValueStore final : public KeyValueStore {
 public:
  explicit FileKeyValueStore(const std::string& dir) : url_("file://" + dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw UnavailableError(str_cat(url_, ": cannot create directory: ", ec.message()));
    try {
      store_ = std::make_unique<FileStore>(dir);
    } catch (const gloo::Exception& e) {
      throw UnavailableError(str_cat(url_, ": ", e.what()));
    }
  }
  void set(const std::string& key, std::string_view value) override { store_->put(key, value); }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const std::string keys[] = {key};
    wait(keys, timeout);
    auto v = store_->read(key);
    if (!v) throw UnavailableError(str_cat(url_, ": key '", key, "' vanished"));
    return *v;
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  bool check(std::span<const std::string> keys) override {
    try {
      return store_->check(std::vector<std::string>(keys.begin(), keys.end()));
    } catch (const gloo::Exception& e) {
      throw UnavailableError(str_cat(url_, ": ", e.what()));
    }
  }
  std::string describe() const override { return url_; }

 private:
  std::string url_;
  std::unique_ptr<FileStore> store_;
};

// Gloo's RedisStore, whose set refuses existing keys (SETNX); this adds SET, INCRBY and a
// non-blocking GET on its connection. hiredis contexts are not thread-safe: one mutex.
class RedisStore final : public gloo::rendezvous::RedisStore {
 public:
  RedisStore(const std::string& host, int port) : gloo::rendezvous::RedisStore(host, port) {}

  redisReply* command(const char* fmt, const std::string& key, const void* data = nullptr,
                      size_t n = 0) {
    void* p = data ? redisCommand(redis_, fmt, key.data(), key.size(), data, n)
                   : redisCommand(redis_, fmt, key.data(), key.size());
    if (p == nullptr) throw UnavailableError(str_cat("redis: ", redis_->errstr));
    auto* r = static_cast<redisReply*>(p);
    if (r->type == REDIS_REPLY_ERROR) {
      std::string msg = r->str;
      freeReplyObject(r);
      throw UnavailableError(str_cat("redis: ", msg));
    }
    return r;
  }
};

class RedisKeyValueStore final : public KeyValueStore {
 public:
  RedisKeyValueStore(const std::string& host, int port)
      : url_(str_cat("redis://", host, ":", port)) {
    try {
      store_ = std::make_unique<RedisStore>(host, port);
    } catch (const gloo::Exception& e) {
      throw UnavailableError(str_cat(url_, ": cannot connect: ", e.what()));
    }
  }
  void set(const std::string& key, std::string_view value) override {
    std::lock_guard<std::mutex> lock(mu_);
    freeReplyObject(store_->command("SET %b %b", key, value.data(), value.size()));
  }
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        redisReply* r = store_->command("GET %b", key);
        if (r->type == REDIS_REPLY_STRING) {
          std::string v(r->str, r->len);
          freeReplyObject(r);
          return v;
        }
        freeReplyObject(r);
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        throw DeadlineExceededError(str_cat(url_, ": timed out after ", timeout.count(),
                                            " ms waiting for key '", key, "'"));
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::milliseconds(10));
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string d = std::to_string(delta);
    redisReply* r;
    try {
      r = store_->command("INCRBY %b %b", key, d.data(), d.size());
    } catch (const UnavailableError& e) {
      throw InvalidArgumentError(str_cat("KeyValueStore::add: key '", key, "': ", e.what()));
    }
    const int64_t v = r->integer;
    freeReplyObject(r);
    return v;
  }
  bool check(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    try {
      return store_->check(std::vector<std::string>(keys.begin(), keys.end()));
    } catch (const gloo::Exception& e) {
      throw UnavailableError(str_cat(url_, ": ", e.what()));
    }
  }
  std::string describe() const override { return url_; }

 private:
  std::string url_;
  std::mutex mu_;
  std::unique_ptr<RedisStore> store_;  // guarded by mu_
};

[[noreturn]] void bad_url(const std::string& url, const std::string& why) {
  throw InvalidArgumentError(str_cat("rendezvous URL '", url, "': ", why,
                                     " (expected host:port, file:///shared/dir, redis://host:port, "
                                     "etcd://host:port[,host:port...] or memory://name)"));
}

std::string peer_json(const PeerInfo& p) {
  nlohmann::json j = {{"rank", p.rank},
                      {"world_size", p.world_size},
                      {"host", p.host},
                      {"pid", p.pid},
                      {"task", p.task}};
  return j.dump();
}

PeerInfo parse_peer(const std::string& s, int rank) {
  try {
    auto j = nlohmann::json::parse(s);
    PeerInfo p;
    p.rank = j.at("rank").get<int>();
    p.world_size = j.at("world_size").get<int>();
    p.host = j.at("host").get<std::string>();
    p.pid = j.at("pid").get<int64_t>();
    p.task = j.at("task").get<std::string>();
    return p;
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgumentError(
        str_cat("rendezvous: rank ", rank, " published an unreadable record: ", e.what()));
  }
}

std::string describe_peer(const PeerInfo& p) {
  std::string s = str_cat("rank ", p.rank);
  if (!p.task.empty()) s += " (" + p.task + ")";
  if (!p.host.empty()) s += str_cat(" at ", p.host);
  s += str_cat(" pid ", p.pid);
  return s;
}

// One "host[:port]" or "[v6][:port]" of a store URL; `default_port` when it names none.
HostPort parse_endpoint(const std::string& url, std::string host, int default_port) {
  int port = default_port;
  std::string port_text;
  if (!host.empty() && host.front() == '[') {  // [ipv6]:port
    const auto close = host.find(']');
    if (close == std::string::npos) bad_url(url, "unterminated '['");
    if (close + 1 < host.size()) {
      if (host[close + 1] != ':') bad_url(url, "expected ':' after ']'");
      port_text = host.substr(close + 2);
    }
    host = host.substr(1, close - 1);
  } else if (auto colon = host.rfind(':'); colon != std::string::npos) {
    port_text = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host.empty()) bad_url(url, "empty host");
  if (!port_text.empty()) {
    try {
      size_t pos = 0;
      port = std::stoi(port_text, &pos);
      if (pos != port_text.size()) throw std::invalid_argument("trailing");
    } catch (const std::exception&) {
      bad_url(url, "port '" + port_text + "' is not a number");
    }
    if (port <= 0 || port > 65535) bad_url(url, "port out of range");
  }
  return HostPort{.host = host, .port = port};
}

}  // namespace

std::vector<HostPort> parse_etcd_url(const std::string& url) {
  if (url.rfind("etcd://", 0) != 0) bad_url(url, "not an etcd:// URL");
  std::string list = url.substr(7);
  if (!list.empty() && list.back() == '/') list.pop_back();
  if (list.empty()) bad_url(url, "no endpoints");
  std::vector<HostPort> endpoints;
  size_t begin = 0;
  for (;;) {
    const size_t comma = list.find(',', begin);
    endpoints.push_back(parse_endpoint(url, list.substr(begin, comma - begin), 2379));
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return endpoints;
}

std::shared_ptr<KeyValueStore> open_store(const std::string& url) {
  const auto sep = url.find("://");
  if (sep == std::string::npos) {
    // host:port of a coordination service (what dtrain launch puts in DTRAIN_RDZV).
    if (url.find(':') == std::string::npos) bad_url(url, "no scheme and no port");
    parse_host_port(url, "rendezvous address");  // throws InvalidArgumentError when malformed
    return std::make_shared<CoordinationClient>(url);
  }
  const std::string scheme = url.substr(0, sep);
  const std::string rest = url.substr(sep + 3);
  if (scheme == "file") {
    if (rest.empty()) bad_url(url, "empty directory");
    return std::make_shared<FileKeyValueStore>(rest);
  }
  if (scheme == "redis") {
    std::string host = rest;
    if (!host.empty() && host.back() == '/') host.pop_back();
    const HostPort hp = parse_endpoint(url, host, 6379);
    return std::make_shared<RedisKeyValueStore>(hp.host, hp.port);
  }
  if (scheme == "etcd") return std::make_shared<EtcdKeyValueStore>(parse_etcd_url(url));
  if (scheme == "memory") {
    static std::mutex mu;
    static std::map<std::string, std::shared_ptr<KeyValueStore>> stores;
    std::lock_guard<std::mutex> lock(mu);
    auto& s = stores[rest];
    if (!s) s = std::make_shared<InMemoryKeyValueStore>();
    return s;
  }
  bad_url(url, "unknown scheme '" + scheme + "'");
}

RendezvousResult rendezvous(const std::shared_ptr<KeyValueStore>& store,
                            const RendezvousOptions& options) {
  DTRAIN_CHECK(store != nullptr, "rendezvous: store is null");
  DTRAIN_CHECK(options.world_size >= 1, "rendezvous: world_size is ", options.world_size,
               ", must be at least 1");
  DTRAIN_CHECK(options.rank >= 0 && options.rank < options.world_size, "rendezvous: rank ",
               options.rank, " is out of range for world_size ", options.world_size);
  RendezvousResult result;
  const std::string run = "dtrain/" + options.run_id + "/";
  if (options.generation) {
    DTRAIN_CHECK(*options.generation >= 0, "rendezvous: generation ", *options.generation,
                 " is negative");
    result.generation = *options.generation;
  } else {
    const int64_t ticket = store->add(run + "arrivals", 1);
    result.generation = (ticket - 1) / options.world_size;
  }
  auto gen_store =
      std::make_shared<PrefixKeyValueStore>(store, str_cat(run, "g", result.generation, "/"));
  PeerInfo me{options.rank, options.world_size, options.host, static_cast<int64_t>(::getpid()),
              options.task};
  gen_store->set(str_cat("peer/", options.rank), peer_json(me));

  const auto deadline = std::chrono::steady_clock::now() + options.timeout;
  result.peers.resize(options.world_size);
  std::vector<int> arrived;
  for (int r = 0; r < options.world_size; ++r) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    std::string value;
    try {
      value = gen_store->get(str_cat("peer/", r), std::max(left, std::chrono::milliseconds(0)));
    } catch (const DeadlineExceededError&) {
      std::vector<std::string> keys;
      std::string missing;
      for (int q = r; q < options.world_size; ++q) {
        const std::string k[] = {str_cat("peer/", q)};
        if (!gen_store->check(k)) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      }
      std::string present;
      for (int q : arrived) present += (present.empty() ? "" : ", ") + std::to_string(q);
      throw DeadlineExceededError(
          str_cat("rendezvous on ", store->describe(), " (run '", options.run_id, "', generation ",
                  result.generation, ") timed out after ", options.timeout.count(), " ms: rank ",
                  options.rank, " of ", options.world_size, " waited for rank(s) ", missing,
                  " that never arrived", present.empty() ? "" : "; arrived: " + present));
    }
    PeerInfo p = parse_peer(value, r);
    if (p.world_size != options.world_size) {
      throw InvalidArgumentError(str_cat("rendezvous: mismatched world sizes: rank ", options.rank,
                                         " was started with ", options.world_size, " workers but ",
                                         describe_peer(p), " with ", p.world_size));
    }
    result.peers[r] = std::move(p);
    arrived.push_back(r);
  }
  result.store = std::move(gen_store);
  return result;
}

}  // namespace dtrain::distribute
