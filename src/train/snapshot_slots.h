// SnapshotSlots: how a worker writes its in-memory snapshots (memory_snapshots.h) into the
// launcher's tmpfs directory with one pass over the state. Each snapshot is an ordinary
// TensorFlow-format checkpoint `<dir>/snap-<step>` (`.index` and `.data-00000-of-00001`, listed
// in the directory's `checkpoint` state file, the newest `max_to_keep` kept), so a snapshot
// restores with Checkpoint::restore like any checkpoint; what differs from a CheckpointManager's
// save is how it is written:
//   - the data goes into slots: hidden tmpfs files (".snap-slot-...") sized once (fallocate),
//     mapped once (MAP_SHARED, pre-faulted) and rewritten in place by later snapshots, so a
//     snapshot allocates, zeroes, faults in and frees no page;
//   - the calling (training) thread copies every value straight into the slot's pages in one
//     pass that also takes its CRC-32C (crc32c::extend_copy: the CRC of the words loaded for the
//     copy, stored past the cache): the copy is the isolation from later updates, and nothing
//     else reads the state again;
//   - the slot's trailer (snapshot_journal.h: the step, the index's bytes, a sequence number
//     written last) then makes the snapshot whole, without a system call;
//   - its files — the index, the data file as a hard link to the slot, the state file — are made
//     either at once (the default: on the same thread or, commit_in_background, on this object's
//     own) or, with `journal`, only when something asks for them: flush(), snapshots(), a
//     successor's constructor, or the launcher's materialize_journal() once this writer is gone.
//     On a VM whose system calls are slow the files cost twice what the copy does (about 17
//     calls); readers that can read trailers (the launcher's agreement) need none of them.
// A writer killed mid-copy leaves an odd sequence number and nothing listed.
//
// A dropped snapshot's slot becomes a spare only when nothing else can be reading or holding it:
// its files are removed first (the index first, so no new reader takes it), then it is kept only
// if this process gets an exclusive flock on it (readers — BundleReader, the launcher's
// replicator — hold a shared one while they read) and it has no other link (the launcher pins a
// snapshot by hard-linking its files). Otherwise its name is removed and the reader or the pin
// keeps the bytes; a new slot is made for the next snapshot. A slot stays exclusively locked from
// then until the snapshot written into it is whole.
//
// With `commit_in_background`, save() returns once the copy is made and whole, and a thread of
// this object makes its files and drops the oldest snapshot; the next save(), snapshots() and
// flush() wait for that commit first, so one commit at most is in flight and a commit's error is
// thrown by the call after it. Thread-compatible: one thread calls save().
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dtrain/checkpoint/checkpoint.h"
#include "dtrain/checkpoint/tensor_bundle.h"
#include "snapshot_journal.h"

namespace dtrain::train {

struct SnapshotSlotsOptions {
  int max_to_keep = 6;                     // committed snapshots listed in the state file
  std::string name = kMemorySnapshotName;  // file prefix inside the directory: <name>-<step>
  bool commit_in_background = false;       // see above
  bool journal = false;                    // files only on demand (see above)
};

class SnapshotSlots {
 public:
  // Creates `dir`, takes its lock (`<dir>/.dtrain.lock`, as a CheckpointManager does: one writer
  // per directory), removes the slot files a dead writer left behind, and continues the
  // retention of the snapshots its state file lists (a predecessor's). `ckpt` (whose values are
  // written) must outlive this object. Throws FailedPreconditionError when another process holds
  // the directory, and file errors naming the path.
  SnapshotSlots(std::string dir, checkpoint::Checkpoint& ckpt, SnapshotSlotsOptions options = {});
  ~SnapshotSlots();
  SnapshotSlots(const SnapshotSlots&) = delete;
  SnapshotSlots& operator=(const SnapshotSlots&) = delete;

  // Writes `ckpt`'s current values as `<dir>/<name>-<step>` and commits it (counting a save of
  // `ckpt`, as CheckpointManager::save does); a kept snapshot of the same step (a rollback)
  // is replaced, after it is taken off the list. Returns the prefix. Throws
  // ResourceExhaustedError when tmpfs is full and other file errors naming the path; the
  // snapshots kept before stay intact and listed. In the background: the commit of the
  // previous save is waited for first, and its error (if it failed) is thrown instead, before
  // anything of this one is done.
  std::string save(int64_t step);
  // Waits for the commit in flight, if any, and throws its error; with `journal`, makes the
  // files of the snapshots that have none yet (a snapshot whose files fail is dropped, and the
  // error thrown).
  void flush();

  // The kept snapshots' prefixes, oldest first, each with its files (after the commit in
  // flight; with `journal`, after flush(), whose error the next call throws).
  std::vector<std::string> snapshots();
  // Slot files created so far (a measure of the reuse: stays at max_to_keep + 1 when nothing
  // holds dropped snapshots).
  int64_t slots_created() const { return slots_created_; }
  // Slots taken over from prepare_standby_slots() (not counted in slots_created()).
  int64_t slots_adopted() const { return slots_adopted_; }

  // A hot spare's slots (train/standby.h), made while it stands by. Where every new mapping
  // pays for the first write of each of its pages (a VM with shadow paging: about 4.5 µs per
  // 4 KiB page, MAP_POPULATE or not), a newcomer's first max_to_keep + 1 snapshots into new
  // slots are slow steps that the survivors wait for at the next collective (session 16: 16 ms
  // of a takeover's cost with the MLP's 1.2 MB state); slots mapped and written beforehand cost
  // nothing then. Makes up to `count` slot files of `bytes` each in `dir` (created), each sized,
  // mapped and written once, and keeps them, mapped, for this process's next SnapshotSlots,
  // whose constructor takes them (renamed into its directory) as its first spare slots: one
  // larger than a snapshot is shrunk in place, one smaller is remapped as usual. Stops before
  // the next slot once `stop` is set; a slot finished after that is removed. Returns the number
  // kept. Throws file errors naming the path (a full tmpfs: ResourceExhaustedError).
  static int prepare_standby_slots(const std::string& dir, size_t bytes, int count,
                                   const std::atomic<bool>* stop = nullptr);

 private:
  struct Slot;
  struct StandbyPool;
  static StandbyPool& standby_pool();
  // The constructor's part: prepare_standby_slots()'s slots, renamed into dir_, as spares.
  void adopt_standby_slots();
  struct Layout {
    std::string graph;          // the object graph it was laid out for
    std::string graph_bytes;    // the object graph as a DT_STRING tensor's bytes
    uint32_t graph_crc = 0;     // their CRC (unmasked)
    size_t bytes = 0;           // of the data file
    size_t index_capacity = 0;  // the largest index its entries can have (every CRC nonzero)
    // The index's entries, laid out (the object graph first, then the values at their offsets):
    // a snapshot only sets the values' CRCs, through `values` (in the contents' order; map
    // nodes stay put, also when the map is moved).
    checkpoint::BundleEntries entries;
    std::vector<checkpoint::BundleEntries::iterator> values;
  };
  struct Kept {
    int64_t step;
    std::string prefix;
    double timestamp;
    std::unique_ptr<Slot> slot;  // null: a predecessor's snapshot
    std::string index;           // its index's bytes, until its files are made
    bool files = false;          // its index and data file exist and the state file may list it
  };

  struct Pending {  // the snapshots a commit drops once the new ones are listed
    std::vector<Kept> doomed;
  };
  // Makes the files of the kept snapshots that have none, writes the state file, then drops
  // `p.doomed`. When it fails, the snapshots it was making files for are dropped and `p.doomed`
  // kept, as before the save.
  void commit(Pending p);
  void committer();  // the background thread's loop
  // Waits until no commit is in flight; returns the error kept for the next call (a commit's, or
  // one snapshots() could not throw), null when none, and forgets it.
  std::exception_ptr wait_idle();

  bool matches(const checkpoint::Checkpoint::Contents& c) const;
  void lay_out(const checkpoint::Checkpoint::Contents& c);
  std::unique_ptr<Slot> take_spare();
  // Takes `k` off the disk: its files are removed (the index first), its slot becomes a spare
  // (its trailer no longer whole) or, when a reader or a pin holds it, is unlinked.
  void drop(Kept k);
  // The bytes of a slot for the current layout.
  size_t slot_bytes() const;
  // A new slot file's path: hidden (journal_slot_stem), unique to this process.
  std::string next_slot_path();
  void write_state();
  std::string prefix_of(int64_t step) const;

  std::string dir_;
  checkpoint::Checkpoint& ckpt_;
  SnapshotSlotsOptions options_;
  int lock_fd_ = -1;
  Layout layout_;
  std::deque<Kept> kept_;                      // committed, oldest first
  std::vector<std::unique_ptr<Slot>> spares_;  // locked, unlinked from any snapshot name
  int64_t slots_created_ = 0;
  int64_t slots_adopted_ = 0;
  int64_t next_slot_ = 0;
  // commit_in_background: the thread and the one commit it is handed at a time. Everything
  // above is touched by the committer only while `pending_` is set, by save() only when not.
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Pending> pending_;
  std::exception_ptr error_;
  bool stop_ = false;
};

}  // namespace dtrain::train
