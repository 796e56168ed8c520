// SnapshotSlots (src/train/snapshot_slots.h), on real tmpfs files: every listed snapshot restores
// bitwise the values it was taken of, whatever was saved after it; dropped snapshots' data files
// are rewritten in place (no new file per snapshot), except one that a reader holds with a shared
// flock or a pin hard-links, whose bytes stay those of its own snapshot; a rewritten step
// (a rollback) replaces the listed one; and a writer killed with SIGKILL at random moments, mid-
// copy included, never leaves a torn snapshot listed. Each with the commit on the calling thread,
// on the slots' own (commit_in_background, flushed before the files are looked at) and by journal
// (files made by flush(), or by a successor), and a commit that fails: its error comes from the
// next call, and what was listed before stays. Journal commits: a snapshot is whole with no file
// made, its trailer lists it for another process, and materialize_journal() makes its files once
// its writer is gone (never while it lives).
#include "train/snapshot_slots.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "dtrain/autograd/variable.h"
#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "dtrain/core/error.h"
#include "dtrain/core/parallel_for.h"
#include "dtrain/distribute/launcher_env.h"
#include "testutil/expect_throws.h"
#include "train/memory_snapshots.h"
#include "train/snapshot_journal.h"

namespace dtrain::train {
namespace {

namespace fs = std::filesystem;

// A directory on tmpfs (/dev/shm), where the launcher keeps snapshots; removed at the end.
struct ShmDir {
  std::string path;
  ShmDir() {
    const fs::path base =
        fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
    std::string tmpl = (base / "dtrain_slots_XXXXXX").string();
    EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
    path = tmpl + "/w2-r0";
  }
  ~ShmDir() {
    std::error_code ec;
    fs::remove_all(fs::path(path).parent_path(), ec);
  }
};

// The state a snapshot holds: two float variables and a counter.
struct State {
  Variable a{"a", Tensor::zeros(Shape{1000})};
  Variable b{"b", Tensor::zeros(Shape{50, 30})};
  int64_t step = 0;
  std::vector<std::pair<std::string, checkpoint::Trackable>> children() {
    return {{"a", a}, {"b", b}, {"step", step}};
  }
  // Values that differ at every step.
  void set(int64_t s) {
    std::mt19937 rng(static_cast<uint32_t>(s));
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* v : {&a, &b}) {
      float* p = v->tensor().data<float>();
      for (int64_t i = 0; i < v->tensor().num_elements(); ++i) p[i] = u(rng);
    }
    step = s;
  }
  std::string bytes() const {
    const Tensor& ta = a.tensor();
    const Tensor& tb = b.tensor();
    return std::string(static_cast<const char*>(ta.raw_data()), ta.nbytes()) +
           std::string(static_cast<const char*>(tb.raw_data()), tb.nbytes()) + std::to_string(step);
  }
};

// What snapshot `prefix` restores into a fresh state.
std::string restored(const std::string& prefix) {
  State s;
  checkpoint::Checkpoint ckpt(s.children());
  ckpt.restore(prefix).assert_existing_objects_matched();
  return s.bytes();
}

std::string expected(int64_t step) {
  State s;
  s.set(step);
  return s.bytes();
}

ino_t inode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The parameter: how snapshots are committed.
enum Mode { kOnTheCallingThread, kInTheBackground, kByJournal };

class SnapshotSlotsModes : public ::testing::TestWithParam<Mode> {
 protected:
  SnapshotSlotsOptions options(int max_to_keep = 6) const {
    return {.max_to_keep = max_to_keep,
            .commit_in_background = GetParam() == kInTheBackground,
            .journal = GetParam() == kByJournal};
  }
};

INSTANTIATE_TEST_SUITE_P(Commit, SnapshotSlotsModes,
                         ::testing::Values(kOnTheCallingThread, kInTheBackground, kByJournal),
                         [](const ::testing::TestParamInfo<Mode>& p) {
                           switch (p.param) {
                             case kOnTheCallingThread:
                               return std::string("OnTheCallingThread");
                             case kInTheBackground:
                               return std::string("InTheBackground");
                             case kByJournal:
                               return std::string("ByJournal");
                           }
                           return std::string("Unknown");
                         });

TEST_P(SnapshotSlotsModes, EverySnapshotRestoresBitwiseAndSlotsAreReused) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt, options(6));
  std::set<ino_t> data_inodes;
  for (int64_t step = 10; step <= 300; step += 10) {
    live.set(step);
    const std::string prefix = slots.save(step);
    live.set(step + 1000);  // the copy is made when save() returns
    slots.flush();
    EXPECT_EQ(prefix, dir.path + "/snap-" + std::to_string(step));
    data_inodes.insert(inode(checkpoint::data_filename(prefix, 0, 1)));
    live.set(step + 1);  // a later update never reaches the snapshot
    const std::vector<std::string> listed = slots.snapshots();
    ASSERT_LE(listed.size(), 6u);
    for (const std::string& p : listed) {
      const int64_t s = std::stoll(p.substr(p.rfind('-') + 1));
      EXPECT_EQ(restored(p), expected(s)) << p << " after saving step " << step;
    }
  }
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path), dir.path + "/snap-300");
  // Seven slot files (six kept, one being written) served thirty snapshots.
  EXPECT_EQ(slots.slots_created(), 7);
  EXPECT_EQ(data_inodes.size(), 7u);
  // Nothing else is in the directory: six snapshots, the state file, the lock, and the seven
  // slots (hidden names; six of them linked as the snapshots' data files).
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 6 * 2 + 2 + 7);
}

TEST_P(SnapshotSlotsModes, AReadersLockOrAPinKeepsADroppedSnapshotsBytes) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt, options(2));
  live.set(1);
  const std::string first = slots.save(1);
  live.set(2);
  const std::string second = slots.save(2);
  slots.flush();
  // The launcher's replicator reads snapshot 1 (a shared flock on its data file, held)...
  const std::string data1 = checkpoint::data_filename(first, 0, 1);
  const int fd = ::open(data1.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH | LOCK_NB), 0);
  std::string before(static_cast<size_t>(fs::file_size(data1)), '\0');
  ASSERT_EQ(::pread(fd, before.data(), before.size(), 0), static_cast<ssize_t>(before.size()));
  // ... and pins snapshot 2 (hard links, as SnapshotKeeper::pin_local).
  const fs::path pin = fs::path(dir.path).parent_path() / "pinned";
  fs::create_directories(pin);
  for (const std::string& f :
       {checkpoint::index_filename(second), checkpoint::data_filename(second, 0, 1)}) {
    ASSERT_EQ(::link(f.c_str(), (pin / fs::path(f).filename()).c_str()), 0);
  }
  for (int64_t step = 3; step <= 20; ++step) {
    live.set(step);
    slots.save(step);
  }
  slots.flush();
  // The held file was never rewritten: same bytes, and what it holds is still snapshot 1.
  std::string after(before.size(), '\0');
  ASSERT_EQ(::pread(fd, after.data(), after.size(), 0), static_cast<ssize_t>(after.size()));
  EXPECT_TRUE(before == after) << "a dropped snapshot that a reader holds was overwritten";
  ::close(fd);
  EXPECT_EQ(restored((pin / "snap-2").string()), expected(2)) << "the pinned snapshot changed";
  // Neither file became a slot again: two more were made for them.
  EXPECT_EQ(slots.slots_created(), 3 + 2);
  EXPECT_EQ(restored(dir.path + "/snap-20"), expected(20));
  EXPECT_EQ(restored(dir.path + "/snap-19"), expected(19));
}

TEST_P(SnapshotSlotsModes, ARewrittenStepReplacesTheListedOne) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt, options());
  for (int64_t step : {10, 20, 30}) {
    live.set(step);
    slots.save(step);
  }
  // A rollback to 10: step 20 is taken again, with other values.
  live.set(1020);
  slots.save(20);
  slots.flush();
  EXPECT_EQ(slots.snapshots(),
            (std::vector<std::string>{dir.path + "/snap-10", dir.path + "/snap-30",
                                      dir.path + "/snap-20"}));
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path), dir.path + "/snap-20");
  EXPECT_EQ(restored(dir.path + "/snap-20"), expected(1020));
  EXPECT_EQ(restored(dir.path + "/snap-10"), expected(10));
}

TEST(SnapshotSlots, ASecondWriterOfOneDirectoryIsRefused) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt);
  testutil::expect_throws_with<FailedPreconditionError>(
      [&] { SnapshotSlots other(dir.path, ckpt); }, {"is in use"});
}

// A commit that fails (here the index cannot take its name: a directory holds it) lists nothing
// new and drops nothing; its error names the file, from save() itself or, committed in the
// background, from the next call; the writer goes on with the next snapshot.
TEST_P(SnapshotSlotsModes, AFailedCommitKeepsWhatWasListedAndSaysWhy) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt, options(2));
  live.set(1);
  slots.save(1);
  slots.flush();
  fs::create_directories(dir.path + "/snap-2.index");
  live.set(2);
  if (GetParam() != kOnTheCallingThread) {
    slots.save(2);  // copied; the commit fails beside it, or when the files are asked for
    testutil::expect_throws_with<Error>([&] { slots.flush(); }, {"snap-2.index"});
  } else {
    testutil::expect_throws_with<Error>([&] { slots.save(2); }, {"snap-2.index"});
  }
  EXPECT_EQ(slots.snapshots(), std::vector<std::string>{dir.path + "/snap-1"});
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path), dir.path + "/snap-1");
  EXPECT_EQ(restored(dir.path + "/snap-1"), expected(1));
  live.set(3);
  slots.save(3);
  slots.flush();  // the error was thrown once
  EXPECT_EQ(slots.snapshots(),
            (std::vector<std::string>{dir.path + "/snap-1", dir.path + "/snap-3"}));
  EXPECT_EQ(restored(dir.path + "/snap-3"), expected(3));
}

// A writer SIGKILLed at random moments (mid-copy included: the state is 16 MB, a copy takes
// milliseconds) never leaves a torn snapshot listed; its successor continues the retention.
TEST_P(SnapshotSlotsModes, AWriterKilledAtRandomNeverLeavesATornSnapshotListed) {
  ShmDir dir;
  std::mt19937 rng(15);
  int64_t first = 1;
  for (int round = 0; round < 6; ++round) {
    int started[2];
    ASSERT_EQ(::pipe(started), 0);
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::close(started[0]);
      try {
        Variable big("big", Tensor::zeros(Shape{4 << 20}));
        int64_t step = 0;
        checkpoint::Checkpoint ckpt({{"big", big}, {"step", step}});
        SnapshotSlots slots(dir.path, ckpt, options(3));
        for (step = first;; ++step) {
          float* p = big.tensor().data<float>();
          for (int64_t i = 0; i < big.tensor().num_elements(); ++i) p[i] = static_cast<float>(step);
          slots.save(step);
          if (step == first) {
            slots.flush();
            const char c = 1;  // one snapshot committed: the parent may kill from now on
            (void)!::write(started[1], &c, 1);
          }
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer: %s\n", e.what());
      }
      ::_exit(1);  // never back into the test runner
    }
    // However loaded the machine, each writer commits a snapshot before the kill can come.
    ::close(started[1]);
    char c = 0;
    ASSERT_EQ(::read(started[0], &c, 1), 1) << "the writer died before its first snapshot";
    ::close(started[0]);
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 400)(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    // Every listed snapshot is whole: its CRCs match and it holds its own step everywhere.
    Variable big("big", Tensor::zeros(Shape{4 << 20}));
    int64_t step = 0;
    checkpoint::Checkpoint ckpt({{"big", big}, {"step", step}});
    SnapshotSlots successor(dir.path, ckpt, {.max_to_keep = 3});
    const std::vector<std::string> listed = successor.snapshots();
    for (const std::string& p : listed) {
      ckpt.restore(p).assert_existing_objects_matched();
      const int64_t s = std::stoll(p.substr(p.rfind('-') + 1));
      EXPECT_EQ(step, s) << p;
      const float* v = big.tensor().data<float>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < big.tensor().num_elements(); ++i) wrong += v[i] != float(s);
      EXPECT_EQ(wrong, 0) << p << " is torn";
    }
    // The successor's own snapshots continue after the newest listed one.
    first = listed.empty() ? 1 : std::stoll(listed.back().substr(listed.back().rfind('-') + 1)) + 1;
    std::printf("round %d: %zu snapshots listed, newest %s\n", round, listed.size(),
                listed.empty() ? "-" : listed.back().c_str());
  }
  EXPECT_GT(first, 6) << "the writers committed fewer snapshots than they were started";
}

// The files directly in `dir`.
int files_in(const std::string& dir) {
  int n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); ++it) ++n;
  return n;
}

// The names in `dir`, sorted.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Journal commits: once its slots exist, a snapshot changes no name in the directory (no file is
// made, renamed or removed: the commit is the slot's trailer); another process reads the kept
// steps from the trailers; and the files, made on demand, restore bitwise.
TEST(SnapshotSlots, AJournaledSnapshotIsWholeWithoutAFileMade) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt, {.max_to_keep = 3, .journal = true});
  for (int64_t step = 1; step <= 4; ++step) {  // four slots: three kept, one written
    live.set(step);
    slots.save(step);
  }
  const std::vector<std::string> before = names_in(dir.path);
  for (int64_t step = 5; step <= 20; ++step) {
    live.set(step);
    slots.save(step);
    EXPECT_EQ(names_in(dir.path), before) << "a journaled snapshot changed the directory";
    EXPECT_EQ(snapshot_steps(dir.path, "snap"), (std::vector<int64_t>{step - 2, step - 1, step}));
  }
  EXPECT_FALSE(fs::exists(dir.path + "/snap-20.index"));
  EXPECT_FALSE(materialize_journal(dir.path, "snap")) << "the writer lives: its lock is held";
  live.set(999);
  EXPECT_EQ(slots.snapshots(),
            (std::vector<std::string>{dir.path + "/snap-18", dir.path + "/snap-19",
                                      dir.path + "/snap-20"}));
  for (int64_t step : {18, 19, 20}) {
    EXPECT_EQ(restored(dir.path + "/snap-" + std::to_string(step)), expected(step));
  }
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path), dir.path + "/snap-20");
  // After the files were made, the next snapshots drop theirs as they go.
  for (int64_t step = 21; step <= 23; ++step) {
    live.set(step);
    slots.save(step);
  }
  EXPECT_FALSE(fs::exists(dir.path + "/snap-18.index"));
  EXPECT_FALSE(fs::exists(dir.path + "/snap-20.data-00000-of-00001"));
  EXPECT_EQ(snapshot_steps(dir.path, "snap"), (std::vector<int64_t>{21, 22, 23}));
}

// A journaled snapshot whose writer is gone (here: destroyed without a flush, as a killed one)
// gets its files from materialize_journal(), and a torn trailer — a slot being written — lists
// nothing.
TEST(SnapshotSlots, AGoneWritersJournalIsMaterializedAndATornOneIsNot) {
  ShmDir dir;
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  {
    SnapshotSlots slots(dir.path, ckpt, {.max_to_keep = 2, .journal = true});
    for (int64_t step : {10, 20, 30}) {
      live.set(step);
      slots.save(step);
    }
  }
  // The slot of the dropped step 10 is a spare: its trailer holds no whole snapshot.
  EXPECT_EQ(snapshot_steps(dir.path, "snap"), (std::vector<int64_t>{20, 30}));
  // Step 30's slot torn, as by a writer killed mid-copy.
  std::string slot30;
  for (const JournaledSnapshot& j : journaled_snapshots(dir.path, "snap")) {
    if (j.record.step == 30) slot30 = j.slot;
  }
  ASSERT_FALSE(slot30.empty());
  {
    const int fd = ::open(slot30.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    const auto size = static_cast<size_t>(fs::file_size(slot30));
    uint64_t seq = 0;
    const off_t at = static_cast<off_t>(size - kJournalHeaderBytes + 8);
    ASSERT_EQ(::pread(fd, &seq, 8, at), 8);
    ++seq;  // odd: being written
    ASSERT_EQ(::pwrite(fd, &seq, 8, at), 8);
    ::close(fd);
  }
  EXPECT_EQ(snapshot_steps(dir.path, "snap"), (std::vector<int64_t>{20}));
  EXPECT_TRUE(materialize_journal(dir.path, "snap"));
  EXPECT_EQ(checkpoint::latest_checkpoint(dir.path), dir.path + "/snap-20");
  EXPECT_EQ(restored(dir.path + "/snap-20"), expected(20));
  EXPECT_FALSE(fs::exists(dir.path + "/snap-30.index"));
  // Again (the launcher does it before every generation): what exists is left as it is.
  const ino_t index = inode(dir.path + "/snap-20.index");
  const ino_t state = inode(dir.path + "/checkpoint");
  EXPECT_TRUE(materialize_journal(dir.path, "snap"));
  EXPECT_EQ(inode(dir.path + "/snap-20.index"), index) << "the index was written again";
  EXPECT_EQ(inode(dir.path + "/checkpoint"), state) << "the state file was written again";
  EXPECT_EQ(restored(dir.path + "/snap-20"), expected(20));
}

// A hot spare's slots, made while it stands by (prepare_standby_slots), are the first slots of
// its SnapshotSlots: taken into its directory (renamed, their mappings kept), shrunk in place to
// a snapshot's size, and no new slot is made while they last; what they hold restores bitwise.
TEST_P(SnapshotSlotsModes, SlotsMadeWhileStandingByAreTheFirstOnesUsed) {
  ShmDir dir, fresh_dir, later_dir;
  const std::string standby = (fs::path(dir.path).parent_path() / ".spare-0-1").string();
  EXPECT_EQ(SnapshotSlots::prepare_standby_slots(standby, 64 * 1024, 3), 3);
  EXPECT_EQ(files_in(standby), 3);
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  SnapshotSlots slots(dir.path, ckpt, options(2));
  EXPECT_EQ(slots.slots_adopted(), 3);
  EXPECT_FALSE(fs::exists(standby)) << "the spare's directory is left behind";
  for (int64_t step = 10; step <= 100; step += 10) {
    live.set(step);
    slots.save(step);
    live.set(step + 1000);
    for (const std::string& p : slots.snapshots()) {
      const int64_t s = std::stoll(p.substr(p.rfind('-') + 1));
      EXPECT_EQ(restored(p), expected(s)) << p << " after saving step " << step;
    }
  }
  EXPECT_EQ(slots.slots_created(), 0) << "three slots (two kept, one written) serve them all";
  // The data files have the size a new slot gets.
  SnapshotSlots fresh(fresh_dir.path, ckpt, options(2));
  EXPECT_EQ(fresh.slots_adopted(), 0) << "the standby slots went to the first SnapshotSlots";
  const std::string fresh_prefix = fresh.save(5);
  fresh.flush();
  EXPECT_EQ(fs::file_size(checkpoint::data_filename(dir.path + "/snap-100", 0, 1)),
            fs::file_size(checkpoint::data_filename(fresh_prefix, 0, 1)));
  EXPECT_LT(fs::file_size(checkpoint::data_filename(fresh_prefix, 0, 1)), 64u * 1024);
  EXPECT_EQ(fresh.slots_created(), 1);
}

// Standby slots smaller than a snapshot are resized to it; once the assignment stops the
// preparation, no slot is made or kept.
TEST(SnapshotSlots, StandbySlotsTooSmallAreResizedAndAStoppedPreparationMakesNone) {
  ShmDir dir;
  const fs::path root = fs::path(dir.path).parent_path();
  EXPECT_EQ(SnapshotSlots::prepare_standby_slots((root / ".spare-1-1").string(), 4096, 2), 2);
  State live;
  checkpoint::Checkpoint ckpt(live.children());
  {
    SnapshotSlots slots(dir.path, ckpt, {.max_to_keep = 1});
    EXPECT_EQ(slots.slots_adopted(), 2);
    live.set(7);
    const std::string prefix = slots.save(7);
    EXPECT_EQ(restored(prefix), expected(7));
    EXPECT_GT(fs::file_size(checkpoint::data_filename(prefix, 0, 1)), 4096u);
    EXPECT_EQ(slots.slots_created(), 0);
  }
  const std::atomic<bool> stop{true};
  EXPECT_EQ(SnapshotSlots::prepare_standby_slots((root / ".spare-2-1").string(), 4096, 5, &stop),
            0);
  EXPECT_EQ(files_in((root / ".spare-2-1").string()), 0);
  ShmDir other;
  SnapshotSlots none(other.path, ckpt, {.max_to_keep = 1});
  EXPECT_EQ(none.slots_adopted(), 0);
}

// MemorySnapshots commits in the background only where a CPU is left beside this node's workers'
// threads (on a saturated machine the commit thread would take a training thread's CPU).
TEST(MemorySnapshots, CommitsBesideTrainingOnlyWhereACpuIsFree) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof set, &set), 0);
  const int cpus = CPU_COUNT(&set);
  const int threads = intra_op_threads();
  struct Restore {
    int threads;
    ~Restore() {
      set_intra_op_threads(threads);
      ::unsetenv(distribute::kEnvLocalWorldSize);
    }
  } restore{threads};
  set_intra_op_threads(1);
  ::setenv(distribute::kEnvLocalWorldSize, "1", 1);
  EXPECT_EQ(MemorySnapshots::spare_cpu_for_commits(), cpus > 1);
  ::setenv(distribute::kEnvLocalWorldSize, std::to_string(cpus).c_str(), 1);
  EXPECT_FALSE(MemorySnapshots::spare_cpu_for_commits())
      << cpus << " workers on " << cpus << " CPUs";
  ::unsetenv(distribute::kEnvLocalWorldSize);  // a worker without a launcher: one on this node
  EXPECT_EQ(MemorySnapshots::spare_cpu_for_commits(), cpus > 1);
  set_intra_op_threads(cpus);
  EXPECT_FALSE(MemorySnapshots::spare_cpu_for_commits()) << "one worker with a thread per CPU";
}

}  // namespace
}  // namespace dtrain::train
