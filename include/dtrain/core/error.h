// Error model of dtrain: exceptions named after TensorFlow's error codes, so that code that
// catches `UnavailableError` reads like TF code catching `tf.errors.UnavailableError`.
// All types are immutable values; thread-safe.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace dtrain {

// Numbering follows tensorflow/core/protobuf/error_codes.proto.
enum class ErrorCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
};

// Returns the TF name of a code, e.g. "INVALID_ARGUMENT".
const char* error_code_name(ErrorCode code);

// Base of every exception dtrain throws on purpose.
class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

#define DTRAIN_DEFINE_ERROR(Name, Code)                                            \
  class Name : public Error {                                                      \
   public:                                                                         \
    explicit Name(const std::string& message) : Error(ErrorCode::Code, message) {} \
  };
DTRAIN_DEFINE_ERROR(InvalidArgumentError, kInvalidArgument)
DTRAIN_DEFINE_ERROR(NotFoundError, kNotFound)
DTRAIN_DEFINE_ERROR(AlreadyExistsError, kAlreadyExists)
DTRAIN_DEFINE_ERROR(PermissionDeniedError, kPermissionDenied)
DTRAIN_DEFINE_ERROR(DataLossError, kDataLoss)
DTRAIN_DEFINE_ERROR(UnavailableError, kUnavailable)
DTRAIN_DEFINE_ERROR(DeadlineExceededError, kDeadlineExceeded)
DTRAIN_DEFINE_ERROR(AbortedError, kAborted)
DTRAIN_DEFINE_ERROR(FailedPreconditionError, kFailedPrecondition)
DTRAIN_DEFINE_ERROR(OutOfRangeError, kOutOfRange)
DTRAIN_DEFINE_ERROR(ResourceExhaustedError, kResourceExhausted)
DTRAIN_DEFINE_ERROR(UnimplementedError, kUnimplemented)
DTRAIN_DEFINE_ERROR(InternalError, kInternal)
#undef DTRAIN_DEFINE_ERROR

// Throws the exception class of `code` (InvalidArgumentError for kInvalidArgument, ...) with
// `message`: how an error that crossed a process boundary as a code is raised again.
// kCancelled raises UnavailableError; kOk and unknown codes raise InternalError.
[[noreturn]] void throw_error(ErrorCode code, const std::string& message);

namespace detail {
template <class... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
}  // namespace detail

// Builds a message from streamable pieces: str_cat("Dense: ", n, " features").
template <class... Args>
std::string str_cat(Args&&... args) {
  return detail::str_cat(std::forward<Args>(args)...);
}

}  // namespace dtrain

// Throws InvalidArgumentError with the streamed message when `cond` is false. The message
// should name the function and the values involved ("Dense: input has 783 features, ...").
#define DTRAIN_CHECK(cond, ...)                                             \
  do {                                                                      \
    if (!(cond)) [[unlikely]] {                                             \
      throw ::dtrain::InvalidArgumentError(::dtrain::str_cat(__VA_ARGS__)); \
    }                                                                       \
  } while (0)

// Like DTRAIN_CHECK but for broken internal invariants: throws InternalError with file:line.
#define DTRAIN_INTERNAL_CHECK(cond, ...)                                                   \
  do {                                                                                     \
    if (!(cond)) [[unlikely]] {                                                            \
      throw ::dtrain::InternalError(::dtrain::str_cat(                                     \
          __FILE__, ":", __LINE__, ": internal check failed: " #cond " ", ##__VA_ARGS__)); \
    }                                                                                      \
  } while (0)
