// Copies of committed backups between hosts (src/train/backup_transfer.h), over real sockets on
// 127.0.0.1: a copy arrives byte for byte and restores; a backup the peer does not hold, a peer
// that disappears mid-transfer, a transfer whose CRC-32C does not match and a full local disk
// (a small tmpfs, as root) each give a clear error naming what failed, and leave nothing behind.
// The misbehaving peers are raw sockets that speak the documented wire format.
#include "train/backup_transfer.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/core/crc32c.h"
#include "dtrain/core/error.h"
#include "dtrain/core/random.h"
#include "dtrain/nn/layers.h"
#include "dtrain/nn/model.h"
#include "testutil/expect_throws.h"
#include "testutil/temp_dir.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;
using testutil::expect_throws_with;

// A backup of a small model, "backup-1", in `dir`; returns the model's kernel values.
Tensor write_backup(const std::string& dir, int units = 32) {
  set_random_seed(3);
  nn::Sequential model({nn::Dense(units, {.input_shape = Shape{64}})});
  checkpoint::Checkpoint ckpt({{"model", model}});
  ckpt.save((fs::path(dir) / "backup").string());
  return model.weights()[0]->tensor().clone();
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(dir, ec)) {
    if (e.is_regular_file()) out.push_back(e.path().filename().string());
  }
  return out;
}

bool read_exactly(int fd, void* p, size_t n) {
  for (size_t got = 0; got < n;) {
    const ssize_t r = ::recv(fd, static_cast<char*>(p) + got, n - got, 0);
    if (r <= 0) return false;
    got += static_cast<size_t>(r);
  }
  return true;
}

// A peer on 127.0.0.1 that reads one request and answers with `reply`'s bytes, then closes.
class RawPeer {
 public:
  explicit RawPeer(std::function<std::string()> reply) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(fd_, 1);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, reply] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      // The whole request (two length-prefixed strings), so that closing never resets the
      // connection under unread bytes.
      for (int frame = 0; frame < 2; ++frame) {
        uint64_t n = 0;
        if (!read_exactly(c, &n, sizeof n) || n > 4096) break;
        std::string text(n, '\0');
        if (!read_exactly(c, text.data(), n)) break;
      }
      const std::string r = reply();
      [[maybe_unused]] ssize_t w = ::send(c, r.data(), r.size(), MSG_NOSIGNAL);
      ::shutdown(c, SHUT_WR);
      char drain[256];
      while (::recv(c, drain, sizeof drain, 0) > 0) {
      }
      ::close(c);
    });
  }
  ~RawPeer() {
    thread_.join();
    ::close(fd_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

std::string u64(uint64_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }
std::string u32(uint32_t v) { return std::string(reinterpret_cast<const char*>(&v), sizeof v); }
std::string str(const std::string& s) { return u64(s.size()) + s; }

TEST(BackupTransfer, ACopyArrivesWholeAndRestores) {
  const std::string from = testutil::make_temp_dir(), into = testutil::make_temp_dir();
  const Tensor kernel = write_backup(from);
  BackupFileServer server(from);
  const FetchedBackup got = fetch_backup("127.0.0.1:" + std::to_string(server.port()), "node 0",
                                         "backup-1", into + "/copy");
  EXPECT_EQ(got.prefix, into + "/copy/backup-1");
  EXPECT_EQ(got.files, 2);
  for (const std::string suffix : {".index", ".data-00000-of-00001"}) {
    EXPECT_EQ(testutil::read_bytes(into + "/copy/backup-1" + suffix),
              testutil::read_bytes(from + "/backup-1" + suffix));
  }
  // Nothing else: no temporary file is left.
  EXPECT_EQ(files_in(into).size(), 2u);
  nn::Sequential model({nn::Dense(32, {.input_shape = Shape{64}})});
  checkpoint::Checkpoint ckpt({{"model", model}});
  ckpt.restore(got.prefix).assert_existing_objects_matched();
  EXPECT_TRUE(model.weights()[0]->tensor().equals(kernel));
  fs::remove_all(from);
  fs::remove_all(into);
}

TEST(BackupTransfer, ABackupThePeerDoesNotHoldIsNotFound) {
  const std::string from = testutil::make_temp_dir(), into = testutil::make_temp_dir();
  write_backup(from);
  BackupFileServer server(from);
  const std::string address = "127.0.0.1:" + std::to_string(server.port());
  expect_throws_with<NotFoundError>([&] { fetch_backup(address, "node 1", "backup-7", into); },
                                    {"node 1", "backup-7"});
  // Names that are not plain file names are refused before anything is sent.
  expect_throws_with<InvalidArgumentError>(
      [&] { fetch_backup(address, "node 1", "../etc/backup-1", into); }, {"../etc/backup-1"});
  EXPECT_TRUE(files_in(into).empty());
  fs::remove_all(from);
  fs::remove_all(into);
}

TEST(BackupTransfer, APeerThatDisappearsMidTransferLeavesNothing) {
  const std::string into = testutil::make_temp_dir();
  // Two files announced; the first is cut off after 400 of 1000 bytes.
  RawPeer peer(
      [] { return u64(2) + str(".data-00000-of-00001") + u64(1000) + std::string(400, 'x'); });
  expect_throws_with<UnavailableError>(
      [&] { fetch_backup(peer.address(), "rank 0 (node 0)", "backup-3", into); },
      {"rank 0 (node 0)", "after 400 of 1000 bytes", "backup-3.data-00000-of-00001",
       "nothing of it was kept"});
  EXPECT_TRUE(files_in(into).empty());
  fs::remove_all(into);
}

TEST(BackupTransfer, ACorruptTransferFailsItsCrcAndLeavesNothing) {
  const std::string into = testutil::make_temp_dir();
  const std::string data(1000, 'd'), index(100, 'i');
  // The data shard arrives whole with its checksum; the index's checksum does not match.
  RawPeer peer([&] {
    return u64(2) + str(".data-00000-of-00001") + u64(data.size()) + data +
           u32(crc32c::value(data)) + str(".index") + u64(index.size()) + index +
           u32(crc32c::value(index) ^ 1);
  });
  expect_throws_with<DataLossError>(
      [&] { fetch_backup(peer.address(), "node 2", "backup-3", into); },
      {"backup-3.index", "node 2", "CRC-32C"});
  EXPECT_TRUE(files_in(into).empty()) << "a partial copy was kept";
  fs::remove_all(into);
}

TEST(BackupTransfer, AFullLocalDiskIsResourceExhaustedAndLeavesNothing) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to mount a tmpfs (CI runs the tests as root)";
  const std::string from = testutil::make_temp_dir(), work = testutil::make_temp_dir();
  write_backup(from, 2048);  // a 512 KiB kernel
  const std::string mnt = work + "/mnt";
  fs::create_directory(mnt);
  if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=256k") != 0) {
    const std::string err = std::strerror(errno);
    fs::remove_all(work);
    GTEST_SKIP() << "cannot mount a tmpfs on " << mnt << ": " << err;
  }
  {
    BackupFileServer server(from);
    expect_throws_with<ResourceExhaustedError>(
        [&] {
          fetch_backup("127.0.0.1:" + std::to_string(server.port()), "node 0", "backup-1",
                       mnt + "/copy");
        },
        {mnt + "/copy/backup-1.data-00000-of-00001"});
  }
  EXPECT_TRUE(files_in(mnt).empty()) << "a partial copy was kept";
  ::umount2(mnt.c_str(), MNT_DETACH);
  fs::remove_all(work);
  fs::remove_all(from);
}

TEST(BackupTransfer, ANamelessPeerIsUnavailable) {
  const std::string into = testutil::make_temp_dir();
  // A port nobody listens on (the server is gone).
  int port = 0;
  {
    BackupFileServer server(into);
    port = server.port();
  }
  expect_throws_with<UnavailableError>(
      [&] { fetch_backup("127.0.0.1:" + std::to_string(port), "node 1", "backup-1", into); },
      {"cannot connect to node 1"});
  fs::remove_all(into);
}

}  // namespace
}  // namespace dtrain::train
