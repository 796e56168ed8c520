// The journal of a snapshot slot (snapshot_slots.h): what makes a snapshot written into a slot
// complete without a system call. A slot file holds the snapshot's data file bytes from offset 0
// (TensorFlow's `.data-00000-of-00001` layout, so the slot itself can be linked under that name)
// and ends with a trailer: the snapshot's step and time, its `.index` file's bytes, and a
// sequence number that is odd while the slot is being written and even once the snapshot in it
// is whole. The writer marks the slot odd before it writes a byte of the data and publishes the
// trailer, then the even number, last; a writer killed anywhere in between leaves an odd number
// (or the trailer of the snapshot the slot held before, which it invalidated first). So the
// trailer, read in another process — while the writer lives (the sequence number read before and
// after, and the trailer's CRC) or after it died — says which snapshots are whole.
//
// The files TensorFlow's readers need (`<name>-<step>.index`, the data file as a hard link to the
// slot, the directory's `checkpoint` state file) are made from the trailers on demand: by the
// writer when something of its own process asks for them (SnapshotSlots::flush), and by
// materialize_journal() for a writer that is gone (the launcher before a new generation, a
// successor's SnapshotSlots). Private to src/train and src/fault.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dtrain::train {

// The trailer's fixed part, the last bytes of a slot file.
inline constexpr size_t kJournalHeaderBytes = 64;
// A snapshot directory's lock (held by its writer, as a CheckpointManager's) and state file.
inline constexpr const char* kSnapshotLockFile = ".dtrain.lock";
inline constexpr const char* kSnapshotStateFile = "checkpoint";
// The writer name of a worker's in-memory snapshots (SnapshotSlotsOptions::name): its files are
// "snap-<step>.*", its slots ".snap-slot-*".
inline constexpr const char* kMemorySnapshotName = "snap";

// ".<name>-slot-": the start of the hidden names of writer `name`'s slot files.
std::string journal_slot_stem(const std::string& name);

// The size of a slot file for `data_bytes` of data and an index of up to `index_capacity` bytes.
size_t journal_slot_bytes(size_t data_bytes, size_t index_capacity);
// The index bytes a slot of `slot_bytes` with `data_bytes` of data can hold.
size_t journal_index_capacity(size_t slot_bytes, size_t data_bytes);

// Writer side, on a slot mapped whole (`map`, `size` bytes): marks it as being written (its
// previous snapshot, if any, is no longer whole for any reader), before any byte of the data is.
void journal_begin(uint8_t* map, size_t size);
// After the data: the trailer of the snapshot of `step`, and then its even sequence number.
// `index` must fit (journal_index_capacity).
void journal_publish(uint8_t* map, size_t size, int64_t step, double timestamp, size_t data_bytes,
                     const std::string& index);

// A whole snapshot's trailer, as read.
struct JournalRecord {
  int64_t step = 0;
  double timestamp = 0;
  uint64_t data_bytes = 0;
  std::string index;  // the `.index` file's bytes
};
// Reads the trailer of the open slot file `fd`; nullopt when it holds no whole snapshot (being
// written, never written, torn, not a slot).
std::optional<JournalRecord> read_journal(int fd);

// The slot files of writer `name` in `dir` (".<name>-slot-*") and what each holds.
struct JournaledSnapshot {
  std::string slot;  // the slot file's path
  JournalRecord record;
};
std::vector<JournaledSnapshot> journaled_snapshots(const std::string& dir, const std::string& name);
// The snapshots of writer `name` (files `<name>-<step>`) that `dir`'s `checkpoint` state file
// lists, oldest first, with their timestamps when it gives them.
struct ListedSnapshot {
  int64_t step = 0;
  std::string file;  // `<name>-<step>`
  std::optional<double> timestamp;
};
std::vector<ListedSnapshot> listed_snapshots(const std::string& dir, const std::string& name);
// The steps of the whole snapshots in `dir`: those its state file lists and those its slots'
// trailers hold, ascending, each once.
std::vector<int64_t> snapshot_steps(const std::string& dir, const std::string& name);

// The bytes of the whole snapshot of `step` that a slot of writer `name` in `dir` holds, read
// under a shared flock on the slot (a writer reuses only a slot it can lock exclusively, so a
// live writer's snapshot is read whole or not at all); nullopt when no slot holds it whole.
struct JournaledBytes {
  std::string slot;   // the slot file's path
  std::string index;  // the `.index` file's bytes
  std::string data;   // the `.data-00000-of-00001` file's bytes
};
std::optional<JournaledBytes> read_journaled(const std::string& dir, const std::string& name,
                                             int64_t step);
// The trailer of the open slot file `fd` when it holds the whole snapshot of `step` and no
// writer is rewriting it: takes a shared flock on `fd` (kept until `fd` is closed) first.
std::optional<JournalRecord> read_whole(int fd, int64_t step);

// `<prefix>.index` (from `index`) and `<prefix>.data-00000-of-00001` (a hard link to `slot`),
// replacing what those names held. Throws file errors naming the path.
void link_snapshot_files(const std::string& prefix, const std::string& slot,
                         const std::string& index);
// Writes `dir`'s `checkpoint` state file (through a temporary and a rename) listing the snapshot
// files `names` (oldest first) with their timestamps. Throws file errors naming the path.
void write_snapshot_state(const std::string& dir,
                          const std::vector<std::pair<std::string, double>>& names);

// For a writer that is gone: makes the files of every whole snapshot in its slots and lists them
// in the state file after those it lists already (by step). Returns false, doing nothing, when a
// live writer holds the directory's lock (`.dtrain.lock`); throws file errors naming the path.
bool materialize_journal(const std::string& dir, const std::string& name);
// The same, for a caller that holds the directory's lock already.
void materialize_journal_locked(const std::string& dir, const std::string& name);

}  // namespace dtrain::train
