// Event-file reader (include/dtrain/summary/event_reader.h).
#include "dtrain/summary/event_reader.h"

#include "dtrain/core/error.h"

namespace dtrain::summary {

EventReader::EventReader(std::string path, EventReaderOptions options)
    : records_(std::move(path), RecordReaderOptions{.skip_corrupt = options.skip_corrupt}),
      options_(options) {}

std::optional<Event> EventReader::next() {
  std::string data;
  for (;;) {
    const size_t skipped_before = records_.corrupt_regions().size();
    const bool ok = records_.read(&data);
    const auto& regions = records_.corrupt_regions();
    corrupt_.insert(corrupt_.end(), regions.begin() + static_cast<ptrdiff_t>(skipped_before),
                    regions.end());
    if (!ok) return std::nullopt;
    try {
      Event e = decode_event(data);
      ++count_;
      return e;
    } catch (const DataLossError& err) {
      const std::string why =
          str_cat("record of ", data.size(), " bytes is not an Event: ", err.what());
      if (!options_.skip_corrupt) {
        throw DataLossError(
            str_cat(path(), ": record at offset ", records_.record_offset(), ": ", why));
      }
      corrupt_.push_back(
          {records_.record_offset(), records_.offset() - records_.record_offset(), why});
    }
  }
}

std::vector<Event> read_events(const std::string& path) {
  EventReader reader(path);
  std::vector<Event> out;
  while (auto e = reader.next()) out.push_back(std::move(*e));
  return out;
}

}  // namespace dtrain::summary
