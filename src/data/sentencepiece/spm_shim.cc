// The SentencePiece shim (spm_shim.h): libsentencepiece behind a C interface, built as a module
// that dtrain_data loads with dlmopen into a link-map namespace of its own. Debian's
// libsentencepiece.so.0 exports the protobuf-lite it bundles, which clashes with the system
// libprotobuf that gRPC loads; in a namespace of its own it sees only its own copy. Nothing
// but the functions below is exported, no C++ exception crosses the interface, and whatever the
// shim allocates it frees itself.
#include "data/sentencepiece/spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

struct Result {
  std::string error;  // empty: ok
  std::string bytes;
  std::vector<int> ids;
  sentencepiece::SentencePieceProcessor* processor = nullptr;
  ~Result() { delete processor; }
};

// The corpus's lines, one sentence each (empty lines skipped), for the trainer.
class LineIterator final : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(std::string_view corpus) : corpus_(corpus) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (pos_ < corpus_.size()) {
      size_t end = corpus_.find('\n', pos_);
      if (end == std::string_view::npos) end = corpus_.size();
      line_.assign(corpus_.substr(pos_, end - pos_));
      pos_ = end + 1;
      if (!line_.empty()) return;
    }
    done_ = true;
  }

  std::string_view corpus_;
  size_t pos_ = 0;
  std::string line_;
  bool done_ = false;
};

// Runs `f` on a fresh Result; any exception becomes the result's error.
template <typename F>
void* guarded(F&& f) {
  Result* r = new (std::nothrow) Result;
  if (r == nullptr) return nullptr;
  try {
    f(*r);
  } catch (const std::exception& e) {
    r->error = e.what();
  } catch (...) {
    r->error = "unknown error";
  }
  return r;
}

const Result& result(const void* r) { return *static_cast<const Result*>(r); }
const sentencepiece::SentencePieceProcessor& processor(const void* p) {
  return *static_cast<const sentencepiece::SentencePieceProcessor*>(p);
}

}  // namespace

extern "C" {

void* dtrain_spm_load(const char* proto, size_t size) {
  return guarded([&](Result& r) {
    auto* p = new sentencepiece::SentencePieceProcessor;
    const sentencepiece::util::Status status =
        p->LoadFromSerializedProto(std::string_view(proto, size));
    if (!status.ok() || p->GetPieceSize() <= 0) {
      r.error = status.ok() ? std::string("it has no pieces") : status.ToString();
      delete p;
      return;
    }
    r.processor = p;
  });
}

void* dtrain_spm_train(const char* corpus, size_t corpus_size, const char* args, size_t args_size,
                       unsigned seed) {
  return guarded([&](Result& r) {
    std::unordered_map<std::string, std::string> kwargs;
    const std::string_view a(args, args_size);
    size_t pos = 0;
    while (pos < a.size()) {
      const size_t k_end = a.find('\0', pos);
      if (k_end == std::string_view::npos) break;
      const size_t v_end = a.find('\0', k_end + 1);
      if (v_end == std::string_view::npos) break;
      kwargs[std::string(a.substr(pos, k_end - pos))] =
          std::string(a.substr(k_end + 1, v_end - k_end - 1));
      pos = v_end + 1;
    }
    sentencepiece::SetRandomGeneratorSeed(seed);
    LineIterator lines(std::string_view(corpus, corpus_size));
    const sentencepiece::util::Status status =
        sentencepiece::SentencePieceTrainer::Train(kwargs, &lines, &r.bytes);
    if (!status.ok()) r.error = status.ToString();
  });
}

void* dtrain_spm_encode(const void* p, const char* text, size_t size) {
  return guarded([&](Result& r) {
    const sentencepiece::util::Status status =
        processor(p).Encode(std::string_view(text, size), &r.ids);
    if (!status.ok()) r.error = status.ToString();
  });
}

void* dtrain_spm_decode(const void* p, const int* ids, size_t n) {
  return guarded([&](Result& r) {
    const sentencepiece::util::Status status =
        processor(p).Decode(std::vector<int>(ids, ids + n), &r.bytes);
    if (!status.ok()) r.error = status.ToString();
  });
}

int dtrain_spm_piece_size(const void* p) { return processor(p).GetPieceSize(); }

void dtrain_spm_processor_free(void* p) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(p);
}

const char* dtrain_spm_result_error(const void* r) {
  if (r == nullptr) return "out of memory";
  return result(r).error.empty() ? nullptr : result(r).error.c_str();
}

const char* dtrain_spm_result_bytes(const void* r, size_t* size) {
  *size = result(r).bytes.size();
  return result(r).bytes.data();
}

const int* dtrain_spm_result_ids(const void* r, size_t* n) {
  *n = result(r).ids.size();
  return result(r).ids.data();
}

void* dtrain_spm_result_take_processor(void* r) {
  return std::exchange(static_cast<Result*>(r)->processor, nullptr);
}

void dtrain_spm_result_free(void* r) { delete static_cast<Result*>(r); }

}  // extern "C"
