// Every file the dtrain binary writes, on a full disk and on a read-only one: a small tmpfs
// (mounted by the fixture; CI runs as root) filled up with a filler file, or remounted read-only.
// Each writer must fail with a clear one-line error and exit code (RESOURCE_EXHAUSTED naming the
// file, exit 1; PERMISSION_DENIED, exit 9), never crash, leave the previous file byte-identical
// and leave no temporary file behind. A TensorBoard log that fills up during training costs the
// summaries, not the training (docs/decisions.md).
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "distribute_process.h"
#include "dtrain/summary/event_log.h"
#include "testutil/idx_files.h"

namespace dtrain::testing {
namespace {

namespace fs = std::filesystem;
const std::string kDtrain = DTRAIN_BINARY;

struct Result {
  int code;            // exit status, 128 + signal when killed
  std::string output;  // stdout and stderr
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Every regular file under `dir` (recursively) with its bytes, by path relative to `dir`.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = read_file(e.path());
  }
  return out;
}

class FullDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) {
      GTEST_SKIP() << "needs root to mount a tmpfs (CI runs the tests as root)";
    }
    work_ = make_temp_dir("dtrain_full_disk");
    mnt_ = work_ / "mnt";
    fs::create_directory(mnt_);
    if (::mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=256k") != 0) {
      const std::string err = std::strerror(errno);
      fs::remove_all(work_);
      GTEST_SKIP() << "cannot mount a tmpfs on " << mnt_ << ": " << err;
    }
    mounted_ = true;
    testutil::write_small_idx(work_, 64);
    data_ = {"--train-images", (work_ / "x.idx").string(),
             "--train-labels", (work_ / "y.idx").string(),
             "--test-images",  (work_ / "x.idx").string(),
             "--test-labels",  (work_ / "y.idx").string(),
             "--seed",         "1",
             "--verbose",      "0"};
  }

  void TearDown() override {
    if (mounted_) ::umount2(mnt_.c_str(), MNT_DETACH);
    if (!work_.empty()) fs::remove_all(work_);
  }

  // Runs `dtrain ARGS...` (with the data flags after the sub-command when `data`) and waits.
  Result dtrain(std::vector<std::string> args, bool data = false,
                const std::map<std::string, std::string>& env = {}) {
    if (data) args.insert(args.begin() + 1, data_.begin(), data_.end());
    args.insert(args.begin(), kDtrain);
    Process p = spawn(args, env, (work_ / "log.txt").string());
    const int code = wait_for(p, std::chrono::steady_clock::now() + std::chrono::seconds(120));
    return {code, read_file((work_ / "log.txt").string())};
  }

  // Trains a small model and saves it (off the tmpfs): the model the tests predict with.
  fs::path saved_model() {
    const fs::path m = work_ / "model.h5";
    if (!fs::exists(m)) {
      const Result r = dtrain({"fit", "--epochs", "1", "--save", m.string()}, true);
      EXPECT_EQ(r.code, 0) << r.output;
    }
    return m;
  }

  // Fills the tmpfs with a filler file, then frees `leave` bytes (whole 4 KiB pages) of it.
  void fill(size_t leave = 0) {
    const std::string filler = (mnt_ / "filler").string();
    const int fd = ::open(filler.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    const std::string chunk(4096, 'f');
    off_t size = 0;
    for (;;) {
      const ssize_t w = ::write(fd, chunk.data(), chunk.size());
      if (w <= 0) break;
      size += w;
    }
    ASSERT_GE(size, static_cast<off_t>(leave));
    ASSERT_EQ(::ftruncate(fd, size - static_cast<off_t>(leave)), 0);
    ::close(fd);
  }

  void remount_read_only() {
    ASSERT_EQ(::mount("tmpfs", mnt_.c_str(), "tmpfs", MS_REMOUNT | MS_RDONLY, "size=256k"), 0)
        << std::strerror(errno);
  }

  // A failed write: the error line names the code and `path`, the exit code matches, no crash.
  void expect_failure(const Result& r, const char* code_name, int exit_code, const fs::path& path) {
    EXPECT_EQ(r.code, exit_code) << r.output;
    EXPECT_TRUE(contains(r.output, std::string("dtrain: error: ") + code_name)) << r.output;
    EXPECT_TRUE(contains(r.output, path.string())) << r.output;
    EXPECT_FALSE(contains(r.output, "INTERNAL")) << r.output;
    EXPECT_FALSE(contains(r.output, "HDF5")) << r.output;  // libhdf5's noise stays inside
  }

  // The tmpfs holds exactly `before` (besides the filler): nothing changed, nothing left over.
  void expect_unchanged(const std::map<std::string, std::string>& before) {
    std::map<std::string, std::string> now = snapshot(mnt_);
    now.erase("filler");
    std::set<std::string> names_before, names_now;
    for (const auto& [k, v] : before) names_before.insert(k);
    for (const auto& [k, v] : now) names_now.insert(k);
    EXPECT_EQ(names_now, names_before);  // no temporary or empty file left behind
    for (const auto& [name, bytes] : before) {
      EXPECT_TRUE(now.count(name) && now[name] == bytes) << name << " changed";
    }
  }

  fs::path work_, mnt_;
  bool mounted_ = false;
  std::vector<std::string> data_;
};

// Today's bug: an ofstream that nobody checked — exit 0 with an empty file, or the previous
// file overwritten.
TEST_F(FullDisk, PredictOutputFailsAndKeepsThePreviousFile) {
  const fs::path model = saved_model();
  const fs::path prev = mnt_ / "prev.csv";
  std::string old_rows;
  for (int i = 0; i < 1000; ++i) old_rows += "0.25,0.5,0.25\n";  // 14 KB: four pages
  testutil::write_bytes(prev.string(), old_rows);
  fill();
  std::map<std::string, std::string> before = snapshot(mnt_);
  before.erase("filler");
  Result r = dtrain(
      {"predict", "--model", model.string(), "--count", "0", "--output", prev.string()}, true);
  expect_failure(r, "RESOURCE_EXHAUSTED", 1, prev);
  EXPECT_TRUE(contains(r.output, "No space left on device")) << r.output;
  expect_unchanged(before);
  // A new file: not created at all.
  r = dtrain({"predict", "--model", model.string(), "--count", "0", "--output",
              (mnt_ / "new.csv").string()},
             true);
  expect_failure(r, "RESOURCE_EXHAUSTED", 1, mnt_ / "new.csv");
  EXPECT_FALSE(fs::exists(mnt_ / "new.csv"));
}

TEST_F(FullDisk, PredictOutputIsTheWholeCsvWhenThereIsRoom) {
  const fs::path model = saved_model();
  const fs::path out = mnt_ / "out.csv";
  testutil::write_bytes(out.string(), "old\n");
  const Result r = dtrain(
      {"predict", "--model", model.string(), "--count", "0", "--output", out.string()}, true);
  ASSERT_EQ(r.code, 0) << r.output;
  std::ifstream in(out);
  std::string line;
  int rows = 0;
  while (std::getline(in, line)) {
    ++rows;
    EXPECT_EQ(std::count(line.begin(), line.end(), ','), 2) << line;  // three classes
    EXPECT_NO_THROW((void)std::stof(line)) << line;
  }
  EXPECT_EQ(rows, 64);
  EXPECT_EQ(snapshot(mnt_).size(), 1u);  // out.csv only: no temporary file left
}

// Today's bug: RESOURCE_EXHAUSTED, then SIGSEGV (exit 139) in libhdf5's atexit handler, which
// closed again the file whose H5Fclose had failed; or "HDF5: infinite loop closing library".
TEST_F(FullDisk, FitSaveH5FailsWithoutACrashAndKeepsThePreviousFile) {
  const fs::path model = saved_model();
  const fs::path prev = mnt_ / "prev.h5";
  fs::copy_file(model, prev);
  // 0: no room for HDF5's superblock; 16 KiB: room for the first datasets only.
  for (size_t leave : {size_t{0}, size_t{4096}, size_t{16384}}) {
    SCOPED_TRACE("free bytes: " + std::to_string(leave));
    fill(leave);
    std::map<std::string, std::string> before = snapshot(mnt_);
    before.erase("filler");
    const Result r = dtrain({"fit", "--epochs", "1", "--save", prev.string()}, true);
    expect_failure(r, "RESOURCE_EXHAUSTED", 1, prev);
    expect_unchanged(before);
  }
}

TEST_F(FullDisk, CkptConvertToH5FailsWithoutACrashAndKeepsThePreviousFile) {
  const fs::path model = saved_model();
  const fs::path ckpt = work_ / "ckpt" / "model";
  fs::create_directories(ckpt.parent_path());
  Result r = dtrain({"ckpt", "convert", model.string(), ckpt.string()});
  ASSERT_EQ(r.code, 0) << r.output;
  const fs::path prev = mnt_ / "prev.h5";
  fs::copy_file(model, prev);
  for (size_t leave : {size_t{0}, size_t{16384}}) {
    SCOPED_TRACE("free bytes: " + std::to_string(leave));
    fill(leave);
    std::map<std::string, std::string> before = snapshot(mnt_);
    before.erase("filler");
    r = dtrain({"ckpt", "convert", "--overwrite", "--model", model.string(), ckpt.string(),
                prev.string()});
    expect_failure(r, "RESOURCE_EXHAUSTED", 1, prev);
    expect_unchanged(before);
  }
}

TEST_F(FullDisk, CheckpointsFailAndKeepThePreviousOnes) {
  const fs::path dir = mnt_ / "ckpt";
  Result r = dtrain({"fit", "--epochs", "1", "--checkpoint-dir", dir.string()}, true);
  ASSERT_EQ(r.code, 0) << r.output;
  fill();
  std::map<std::string, std::string> before = snapshot(mnt_);
  before.erase("filler");
  ASSERT_TRUE(before.count("ckpt/checkpoint")) << r.output;
  r = dtrain({"fit", "--epochs", "3", "--checkpoint-dir", dir.string(), "--resume"}, true);
  expect_failure(r, "RESOURCE_EXHAUSTED", 1, dir);
  expect_unchanged(before);
}

// A logdir that cannot take the first record fails before training, and leaves no empty event
// file (today: an empty events.out.tfevents file was left behind).
TEST_F(FullDisk, TensorBoardLogdirFullAtStartFailsBeforeTraining) {
  fill();
  const fs::path logdir = mnt_ / "logs";
  const Result r = dtrain({"fit", "--epochs", "1", "--logdir", logdir.string()}, true);
  expect_failure(r, "RESOURCE_EXHAUSTED", 1, logdir);
  EXPECT_FALSE(contains(r.output, "trained")) << r.output;
  std::map<std::string, std::string> files = snapshot(mnt_);
  files.erase("filler");
  EXPECT_TRUE(files.empty()) << files.begin()->first;
}

// A logdir that fills up during training: one warning, the summaries stop, training goes on
// (as with TensorFlow's summary writer), and the event file keeps only whole records. Today
// fit stopped with RESOURCE_EXHAUSTED and the trained model was lost.
TEST_F(FullDisk, TensorBoardLogdirFillingUpDuringTrainingWarnsAndTrainingGoesOn) {
  fill(8192);  // one page for each of the train/ and validation/ event files
  const fs::path logdir = mnt_ / "logs";
  const fs::path model = work_ / "trained.h5";
  const Result r = dtrain({"fit", "--epochs", "40", "--validate", "--logdir", logdir.string(),
                           "--save", model.string()},
                          true);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(fs::exists(model)) << r.output;
  const std::string warning = "dtrain: warning: TensorBoard: RESOURCE_EXHAUSTED";
  ASSERT_TRUE(contains(r.output, warning)) << r.output;
  EXPECT_TRUE(contains(r.output, (logdir / "train").string())) << r.output;
  // One warning per event file (train/ and validation/), not one per event.
  size_t warnings = 0;
  for (size_t at = r.output.find(warning); at != std::string::npos;
       at = r.output.find(warning, at + 1)) {
    ++warnings;
  }
  EXPECT_LE(warnings, 2u) << r.output;
  // Whole records only: dtrain events reads every file without a torn-record warning.
  const Result events = dtrain({"events", (logdir / "train").string()});
  EXPECT_EQ(events.code, 0) << events.output;
  EXPECT_FALSE(contains(events.output, "warning")) << events.output;
  EXPECT_TRUE(contains(events.output, "epoch_loss")) << events.output;
}

// The launcher's JSON-lines event log: a line that does not fit is not left torn at the end of
// the previous log (today: the start of a line stayed behind), and the job goes on.
TEST_F(FullDisk, LauncherEventLogKeepsWholeLinesAndTheJobGoesOn) {
  const fs::path log = mnt_ / "events.jsonl";
  std::string old;
  while (old.size() < 4000) old += "{\"kind\":\"start\",\"generation\":0}\n";
  testutil::write_bytes(log.string(), old);  // most of one page: the next line crosses it
  fill();
  const Result r = dtrain({"launch", "--nproc-per-node", "1", "--grace-period", "1", "--event-log",
                           log.string(), "--", "/bin/true"});
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(contains(r.output,
                       "[launch] warning: cannot record fault events: "
                       "RESOURCE_EXHAUSTED"))
      << r.output;
  EXPECT_TRUE(contains(r.output, log.string())) << r.output;
  EXPECT_EQ(read_file(log.string()), old);
  EXPECT_NO_THROW(summary::read_event_log(log.string()));
}

// A read-only destination is PERMISSION_DENIED (exit 9) for every writer, not INTERNAL (the h5
// writer), NOT_FOUND (predict) or an exit code shared with unexpected errors.
TEST_F(FullDisk, ReadOnlyDestinationIsPermissionDenied) {
  const fs::path model = saved_model();
  const fs::path ckpt = work_ / "ckpt" / "model";
  fs::create_directories(ckpt.parent_path());
  ASSERT_EQ(dtrain({"ckpt", "convert", model.string(), ckpt.string()}).code, 0);
  fs::create_directory(mnt_ / "ck");
  fs::copy_file(model, mnt_ / "prev.h5");
  testutil::write_bytes((mnt_ / "prev.csv").string(), "0.5,0.5\n");
  testutil::write_bytes((mnt_ / "events.jsonl").string(), "{\"kind\":\"start\"}\n");
  remount_read_only();
  std::map<std::string, std::string> before = snapshot(mnt_);

  struct Case {
    std::vector<std::string> args;
    bool data;
    fs::path named;
  };
  const std::vector<Case> cases = {
      {{"predict", "--model", model.string(), "--count", "0", "--output",
        (mnt_ / "prev.csv").string()},
       true,
       mnt_ / "prev.csv"},
      {{"fit", "--epochs", "1", "--save", (mnt_ / "prev.h5").string()}, true, mnt_ / "prev.h5"},
      {{"ckpt", "convert", "--overwrite", "--model", model.string(), ckpt.string(),
        (mnt_ / "prev.h5").string()},
       false,
       mnt_ / "prev.h5"},
      {{"ckpt", "convert", model.string(), (mnt_ / "ck" / "model").string()}, false, mnt_ / "ck"},
      {{"fit", "--epochs", "1", "--checkpoint-dir", (mnt_ / "ck").string()}, true, mnt_ / "ck"},
      {{"fit", "--epochs", "1", "--logdir", (mnt_ / "logs").string()}, true, mnt_ / "logs"},
      {{"launch", "--nproc-per-node", "1", "--event-log", (mnt_ / "events.jsonl").string(), "--",
        "/bin/true"},
       false,
       mnt_ / "events.jsonl"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.args[0] + " " + c.args[c.args.size() - 1]);
    const Result r = dtrain(c.args, c.data);
    expect_failure(r, "PERMISSION_DENIED", 9, c.named);
    EXPECT_TRUE(contains(r.output, "Read-only file system")) << r.output;
  }
  expect_unchanged(before);
}

}  // namespace
}  // namespace dtrain::testing
