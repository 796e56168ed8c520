// SentencePieceTokenizer: training and encoding through libsentencepiece, reached through the
// shim module (sentencepiece/spm_shim.h) in a link-map namespace of its own, so that it works in
// every program, gRPC's included.
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "data/sentencepiece/spm_shim.h"
#include "data/tokenizer_format.h"
#include "dtrain/core/error.h"
#include "dtrain/data/text.h"
#include "dtrain/data/tokenizer.h"

namespace dtrain::data {
namespace {

// The shim's functions, resolved once per process.
struct Shim {
  decltype(&dtrain_spm_load) load;
  decltype(&dtrain_spm_train) train;
  decltype(&dtrain_spm_encode) encode;
  decltype(&dtrain_spm_decode) decode;
  decltype(&dtrain_spm_piece_size) piece_size;
  decltype(&dtrain_spm_processor_free) processor_free;
  decltype(&dtrain_spm_result_error) result_error;
  decltype(&dtrain_spm_result_bytes) result_bytes;
  decltype(&dtrain_spm_result_ids) result_ids;
  decltype(&dtrain_spm_result_take_processor) result_take_processor;
  decltype(&dtrain_spm_result_free) result_free;
};

// Loads the shim into a new namespace (dlmopen): there libsentencepiece and its bundled
// protobuf-lite see neither the program's libprotobuf nor anything else of it.
const Shim& shim() {
  static std::once_flag once;
  static Shim s;
  static std::string error;
  std::call_once(once, [] {
    const char* env = std::getenv("DTRAIN_SPM_SHIM");
    const std::string path = env != nullptr && *env != '\0' ? env : DTRAIN_SPM_SHIM_PATH;
    void* h = ::dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) {
      const char* why = ::dlerror();
      error = str_cat("cannot load the SentencePiece shim ", path, " (", why ? why : "?",
                      "); build dtrain_spm_shim or set DTRAIN_SPM_SHIM to its path");
      return;
    }
    const auto get = [&](const char* name) {
      void* f = ::dlsym(h, name);
      if (f == nullptr && error.empty()) error = str_cat(path, " has no ", name);
      return f;
    };
    s.load = reinterpret_cast<decltype(s.load)>(get("dtrain_spm_load"));
    s.train = reinterpret_cast<decltype(s.train)>(get("dtrain_spm_train"));
    s.encode = reinterpret_cast<decltype(s.encode)>(get("dtrain_spm_encode"));
    s.decode = reinterpret_cast<decltype(s.decode)>(get("dtrain_spm_decode"));
    s.piece_size = reinterpret_cast<decltype(s.piece_size)>(get("dtrain_spm_piece_size"));
    s.processor_free =
        reinterpret_cast<decltype(s.processor_free)>(get("dtrain_spm_processor_free"));
    s.result_error = reinterpret_cast<decltype(s.result_error)>(get("dtrain_spm_result_error"));
    s.result_bytes = reinterpret_cast<decltype(s.result_bytes)>(get("dtrain_spm_result_bytes"));
    s.result_ids = reinterpret_cast<decltype(s.result_ids)>(get("dtrain_spm_result_ids"));
    s.result_take_processor = reinterpret_cast<decltype(s.result_take_processor)>(
        get("dtrain_spm_result_take_processor"));
    s.result_free = reinterpret_cast<decltype(s.result_free)>(get("dtrain_spm_result_free"));
  });
  if (!error.empty()) throw FailedPreconditionError("SentencePieceTokenizer: " + error);
  return s;
}

// A result of the shim, freed by it; throws `E` with `what` and the shim's message on error.
class ShimResult {
 public:
  explicit ShimResult(void* r) : r_(r) {
    if (r_ == nullptr) throw ResourceExhaustedError("SentencePieceTokenizer: out of memory");
  }
  ~ShimResult() { shim().result_free(r_); }
  ShimResult(const ShimResult&) = delete;
  ShimResult& operator=(const ShimResult&) = delete;
  const char* error() const { return shim().result_error(r_); }
  std::string bytes() const {
    size_t n = 0;
    const char* p = shim().result_bytes(r_, &n);
    return std::string(p, n);
  }
  std::vector<int32_t> ids() const {
    size_t n = 0;
    const int* p = shim().result_ids(r_, &n);
    return std::vector<int32_t>(p, p + n);
  }
  void* take_processor() { return shim().result_take_processor(r_); }

 private:
  void* r_;
};

// SentencePiece's trainer and its random generator are process-wide.
std::mutex& trainer_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace

struct SentencePieceTokenizer::Impl {
  std::string model_proto;
  void* processor = nullptr;  // the shim's
  int64_t pieces = 0;
  ~Impl() {
    if (processor != nullptr) shim().processor_free(processor);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Impl> impl)
    : impl_(std::move(impl)) {}
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept =
    default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer SentencePieceTokenizer::train(std::string_view corpus,
                                                     const SentencePieceTrainOptions& options) {
  DTRAIN_CHECK(corpus.find_first_not_of("\r\n") != std::string_view::npos,
               "SentencePieceTokenizer.train: the corpus is empty");
  check_utf8_text(corpus, "SentencePieceTokenizer.train: the corpus");
  DTRAIN_CHECK(options.vocab_size >= 1,
               "SentencePieceTokenizer.train: vocab_size must be >= 1, got ", options.vocab_size);
  DTRAIN_CHECK(options.character_coverage > 0.0 && options.character_coverage <= 1.0,
               "SentencePieceTokenizer.train: character_coverage must be in (0, 1], got ",
               options.character_coverage);
  // Deterministic training: one thread, every sentence (no sampling, no shuffling), a fixed
  // seed. Identity normalization and kept whitespace, so decode(encode(text)) == text for text
  // made of the corpus's characters. "\n" and "\t" are user-defined pieces: sentences are lines,
  // so the trainer never sees "\n", and SentencePiece keeps tabs out of learned pieces.
  const std::pair<std::string, std::string> flags[] = {
      {"model_type",
       options.model_type == SentencePieceTrainOptions::ModelType::kBpe ? "bpe" : "unigram"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"character_coverage", std::to_string(options.character_coverage)},
      {"num_threads", "1"},
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"user_defined_symbols", "\n,\t"},
      {"hard_vocab_limit", "true"},
      {"minloglevel", "2"},
  };
  std::string args;
  for (const auto& [k, v] : flags) {
    args += k;
    args.push_back('\0');
    args += v;
    args.push_back('\0');
  }
  std::string proto;
  {
    std::lock_guard<std::mutex> lock(trainer_mutex());
    ShimResult r(shim().train(corpus.data(), corpus.size(), args.data(), args.size(), 20240607u));
    if (const char* e = r.error()) {
      throw InvalidArgumentError(
          str_cat("SentencePieceTokenizer.train: SentencePiece's trainer failed: ", e));
    }
    proto = r.bytes();
  }
  return from_model_proto(std::move(proto));
}

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& model_path) {
  std::string bytes;
  try {
    bytes = read_file(model_path);
  } catch (const NotFoundError&) {
    throw NotFoundError(
        str_cat("SentencePieceTokenizer.load: ", model_path, ": no such SentencePiece model file"));
  }
  try {
    return from_model_proto(std::move(bytes));
  } catch (const DataLossError& e) {
    throw DataLossError(str_cat("SentencePieceTokenizer.load: ", model_path, ": ", e.what()));
  }
}

SentencePieceTokenizer SentencePieceTokenizer::from_model_proto(std::string model_proto) {
  auto impl = std::make_unique<Impl>();
  impl->model_proto = std::move(model_proto);
  ShimResult r(shim().load(impl->model_proto.data(), impl->model_proto.size()));
  if (const char* e = r.error()) {
    throw DataLossError(
        str_cat("not a SentencePiece model (", impl->model_proto.size(), " bytes): ", e));
  }
  impl->processor = r.take_processor();
  impl->pieces = shim().piece_size(impl->processor);
  return SentencePieceTokenizer(std::move(impl));
}

int64_t SentencePieceTokenizer::vocab_size() const { return impl_->pieces; }

std::vector<int32_t> SentencePieceTokenizer::encode(std::string_view text) const {
  ShimResult r(shim().encode(impl_->processor, text.data(), text.size()));
  if (const char* e = r.error()) {
    throw InvalidArgumentError(str_cat("SentencePieceTokenizer.encode: ", e));
  }
  return r.ids();
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  const int64_t n = vocab_size();
  for (size_t i = 0; i < ids.size(); ++i) {
    DTRAIN_CHECK(ids[i] >= 0 && ids[i] < n, "SentencePieceTokenizer.decode: id ", ids[i],
                 " at position ", i, " is out of range [0, ", n, ")");
  }
  static_assert(sizeof(int) == sizeof(int32_t));
  ShimResult r(
      shim().decode(impl_->processor, reinterpret_cast<const int*>(ids.data()), ids.size()));
  if (const char* e = r.error()) {
    throw InvalidArgumentError(str_cat("SentencePieceTokenizer.decode: ", e));
  }
  return r.bytes();
}

std::string SentencePieceTokenizer::to_bytes() const {
  const nlohmann::json j = {
      {"format", detail::kTokenizerFormat},
      {"version", detail::kTokenizerVersion},
      {"class_name", class_name()},
      {"config", {{"model_proto", detail::base64_encode(impl_->model_proto)}}},
  };
  return j.dump();
}

const std::string& SentencePieceTokenizer::model_proto() const { return impl_->model_proto; }

}  // namespace dtrain::data
