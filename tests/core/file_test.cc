#include "dtrain/core/file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "dtrain/core/error.h"
#include "testutil/temp_dir.h"

namespace dtrain {
namespace {

namespace fs = std::filesystem;

class FileTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testutil::make_temp_dir("dtrain_file_test"); }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (fs::path(dir_) / name).string(); }
  int entries() const {
    int n = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir_)) ++n;
    return n;
  }
  std::string dir_;
};

TEST_F(FileTest, CommitReplacesTheFileAndLeavesNoTemporary) {
  write_file_atomically(path("a"), "old");
  AtomicFile f(path("a"));
  EXPECT_EQ(fs::path(f.temp_path()).parent_path(), fs::path(dir_));
  f.append("new ");
  std::string big(3 << 20, 'x');  // larger than the buffer: written without a copy
  f.append(big);
  f.append("tail");
  EXPECT_EQ(f.size(), 4 + big.size() + 4);
  EXPECT_EQ(read_file(path("a")), "old");  // not visible before commit
  f.commit();
  EXPECT_EQ(read_file(path("a")), "new " + big + "tail");
  EXPECT_EQ(entries(), 1);
}

TEST_F(FileTest, AbortAndDestructionKeepTheOldFile) {
  write_file_atomically(path("a"), "old");
  {
    AtomicFile f(path("a"));
    f.append("half-written");
  }
  EXPECT_EQ(read_file(path("a")), "old");
  AtomicFile g(path("a"));
  g.append("x");
  g.abort();
  g.abort();
  EXPECT_EQ(read_file(path("a")), "old");
  EXPECT_EQ(entries(), 1);
  EXPECT_THROW(g.append("y"), InvalidArgumentError);
}

ino_t inode_of(const std::string& p) {
  struct stat st;
  EXPECT_EQ(::stat(p.c_str(), &st), 0) << p;
  return st.st_ino;
}

TEST_F(FileTest, ReuseOverwritesAnExistingFileInPlaceAndTrimsIt) {
  write_file_atomically(path("a"), "old");
  write_file_atomically(path("spare"), std::string(10000, 's'));  // larger than the new content
  const ino_t spare_inode = inode_of(path("spare"));
  AtomicFile f(path("a"), {.reuse = path("spare")});
  EXPECT_EQ(f.temp_path(), path("spare"));
  f.append("new content");
  EXPECT_EQ(read_file(path("a")), "old");
  f.commit();
  EXPECT_EQ(read_file(path("a")), "new content");  // the spare's tail is gone
  EXPECT_EQ(inode_of(path("a")), spare_inode);     // the same file, renamed
  EXPECT_FALSE(fs::exists(path("spare")));
  EXPECT_EQ(entries(), 1);

  // A smaller spare grows; an aborted one is removed like any temporary.
  write_file_atomically(path("spare"), "xy");
  write_file_atomically(path("b"), "b", {.reuse = path("spare")});
  EXPECT_EQ(read_file(path("b")), "b");
  write_file_atomically(path("spare2"), "zz");
  {
    AtomicFile g(path("b"), {.reuse = path("spare2")});
    g.append(std::string(5000, 'g'));
  }
  EXPECT_EQ(read_file(path("b")), "b");
  EXPECT_FALSE(fs::exists(path("spare2")));
  EXPECT_EQ(entries(), 2);

  // A missing (or non-regular) spare falls back to a new temporary.
  fs::create_directory(path("dir"));
  write_file_atomically(path("c"), "c1", {.reuse = path("missing")});
  write_file_atomically(path("c"), "c2", {.reuse = path("dir")});
  EXPECT_EQ(read_file(path("c")), "c2");
  EXPECT_TRUE(fs::is_directory(path("dir")));
  EXPECT_EQ(entries(), 4);
}

TEST_F(FileTest, ReuseLeavesAFileThatAReaderHoldsAlone) {
  write_file_atomically(path("spare"), "old bytes");
  const int reader = ::open(path("spare").c_str(), O_RDONLY);
  ASSERT_GE(reader, 0);
  ASSERT_EQ(::flock(reader, LOCK_SH | LOCK_NB), 0);  // as BundleReader holds its files
  AtomicFile f(path("a"), {.reuse = path("spare")});
  EXPECT_NE(f.temp_path(), path("spare"));  // a new temporary
  EXPECT_FALSE(fs::exists(path("spare")));  // the held file was deleted, not overwritten
  f.append("new bytes!");
  f.commit();
  EXPECT_EQ(read_file(path("a")), "new bytes!");
  char buf[32] = {};
  EXPECT_EQ(::pread(reader, buf, sizeof(buf), 0), 9);
  EXPECT_EQ(std::string(buf), "old bytes");  // the reader's bytes are intact
  ::close(reader);
}

TEST_F(FileTest, PreadFullReadsAtAnOffsetAndStopsAtTheEnd) {
  write_file_atomically(path("f"), "0123456789");
  const int fd = ::open(path("f").c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  char buf[16] = {};
  EXPECT_EQ(pread_full(fd, buf, 4, 3), 4);
  EXPECT_EQ(std::string(buf, 4), "3456");
  EXPECT_EQ(pread_full(fd, buf, 16, 6), 4);  // the file ends first
  EXPECT_EQ(std::string(buf, 4), "6789");
  EXPECT_EQ(pread_full(fd, buf, 4, 10), 0);
  ::close(fd);
  errno = 0;
  EXPECT_EQ(pread_full(fd, buf, 4, 0), -1);  // closed
  EXPECT_EQ(errno, EBADF);
}

TEST_F(FileTest, ErrorsNameThePathAndMapErrno) {
  try {
    read_file(path("missing"));
    FAIL();
  } catch (const NotFoundError& e) {
    EXPECT_NE(std::string(e.what()).find(path("missing")), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("No such file"), std::string::npos) << e.what();
  }
  EXPECT_THROW(AtomicFile(path("no/such/dir/file")), NotFoundError);
  try {
    throw_file_error(ENOSPC, "write", "/x/y");
  } catch (const ResourceExhaustedError& e) {
    EXPECT_STREQ(e.what(), "write /x/y: No space left on device");
  }
  EXPECT_THROW(throw_file_error(EFBIG, "write", "p"), ResourceExhaustedError);
  EXPECT_THROW(throw_file_error(EISDIR, "open", "p"), InvalidArgumentError);
  for (int err : {EACCES, EPERM, EROFS}) {
    try {
      throw_file_error(err, "open", "p");
      ADD_FAILURE() << "did not throw";
    } catch (const PermissionDeniedError& e) {
      EXPECT_EQ(e.code(), ErrorCode::kPermissionDenied);
      EXPECT_STREQ(e.what(), ("open p: " + std::string(std::strerror(err))).c_str());
    }
  }
  // Raised again from its code (across a process boundary) as the same class.
  EXPECT_THROW(throw_error(ErrorCode::kPermissionDenied, "m"), PermissionDeniedError);
}

// A full disk, simulated with RLIMIT_FSIZE in a child (SIGXFSZ ignored, so write fails with
// EFBIG): the write throws ResourceExhaustedError and the previous file stays intact.
TEST_F(FileTest, FileSizeLimitFailsCleanlyAndKeepsTheOldFile) {
  write_file_atomically(path("a"), "previous");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    rlimit lim{100000, 100000};
    setrlimit(RLIMIT_FSIZE, &lim);
    try {
      AtomicFile f(path("a"));
      std::string chunk(30000, 'z');
      for (int i = 0; i < 10; ++i) f.append(chunk);
      f.commit();
      _exit(1);
    } catch (const ResourceExhaustedError& e) {
      const std::string what = e.what();
      _exit(what.find(path("a")) != std::string::npos &&
                    what.find("File too large") != std::string::npos
                ? 0
                : 2);
    } catch (...) {
      _exit(3);
    }
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(read_file(path("a")), "previous");
  EXPECT_EQ(entries(), 1);  // the temporary file was removed
}

TEST_F(FileTest, EmptyFileAndSyncDirectory) {
  write_file_atomically(path("empty"), "");
  EXPECT_EQ(read_file(path("empty")), "");
  sync_directory(dir_);
  EXPECT_THROW(sync_directory(path("nope")), NotFoundError);
}

}  // namespace
}  // namespace dtrain
