// One harness for the data and summary readers; the first byte picks the reader: IDX, CSV, a
// serialized tokenizer, or TensorBoard event records. Any dtrain::Error is an expected answer to
// bad input; anything else (another exception, a crash, a sanitizer report, a hang) is a bug.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dtrain/core/error.h"
#include "dtrain/data/csv.h"
#include "dtrain/data/idx.h"
#include "dtrain/data/tokenizer.h"
#include "dtrain/summary/event_reader.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t which = data[0] % 4;
  ++data;
  --size;
  try {
    switch (which) {
      case 0:
        (void)dtrain::data::read_idx(dtrain::fuzz::write_input(data, size));
        break;
      case 1:
        (void)dtrain::data::read_csv(dtrain::fuzz::write_input(data, size));
        break;
      case 2: {
        const auto t = dtrain::data::tokenizer_from_bytes(
            std::string_view(reinterpret_cast<const char*>(data), size));
        const std::vector<int32_t> ids = t->encode("Hello, world! \xc3\xa9");
        (void)t->decode(ids);
        break;
      }
      default: {
        for (const bool skip : {false, true}) {
          dtrain::summary::EventReader r(dtrain::fuzz::write_input(data, size),
                                         {.skip_corrupt = skip});
          while (r.next()) {
          }
        }
      }
    }
  } catch (const dtrain::Error&) {
  }
  return 0;
}
