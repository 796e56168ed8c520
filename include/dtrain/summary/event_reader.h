// Reads the Events of a TensorBoard event file (TensorFlow's, PyTorch's or dtrain's): TFRecord
// framing checked record by record, each record decoded as an Event. Used by `dtrain events` and
// the tests. An EventReader is thread-compatible.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "dtrain/summary/event.h"
#include "dtrain/summary/record.h"

namespace dtrain::summary {

struct EventReaderOptions {
  bool skip_corrupt = false;  // skip records that fail their CRCs or do not parse as an Event
                              // (listed in corrupt_regions()) instead of throwing
};

class EventReader {
 public:
  // Opens `path`. Throws NotFoundError when it does not exist, another Error naming the path.
  explicit EventReader(std::string path, EventReaderOptions options = {});

  // The next Event, or nullopt at the end of the file or at a truncated last record (then
  // truncated() is true and truncation() names the offset). Throws DataLossError naming the
  // path, the record's offset and the CRC mismatch or parse error, unless options.skip_corrupt.
  // Blocks on file reads.
  std::optional<Event> next();

  // Offset of the record next() returned last.
  uint64_t record_offset() const { return records_.record_offset(); }
  // Records returned so far.
  uint64_t count() const { return count_; }
  bool truncated() const { return records_.truncated(); }
  const std::string& truncation() const { return records_.truncation(); }
  const std::vector<CorruptRegion>& corrupt_regions() const { return corrupt_; }
  const std::string& path() const { return records_.path(); }

 private:
  RecordReader records_;
  EventReaderOptions options_;
  std::vector<CorruptRegion> corrupt_;
  uint64_t count_ = 0;
};

// All events of `path` up to the end or a truncated tail. Throws like EventReader::next().
std::vector<Event> read_events(const std::string& path);

}  // namespace dtrain::summary
