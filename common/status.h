// Status and StatusOr: how herd reports errors without exceptions.
//
// Every bad input must end in one clear line naming what and where; a Status
// carries exactly that line up to main(), which prints it and exits non-zero.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace herd {

class Status {
 public:
  enum class Code {
    kOk,
    kInvalidArgument,
    kNotFound,
    kIOError,
    kCorruption,
    kFailedPrecondition,
    kInternal,
    kUnavailable,  // a peer or the coordinator is gone
    kAborted,      // the job was stopped by a failure elsewhere
    kCancelled,    // the job was shut down on purpose (a signal, an operator): nothing to retry
  };

  Status() = default;
  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(Code::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(Code::kNotFound, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(Code::kIOError, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(Code::kCorruption, std::move(msg)); }
  static Status FailedPrecondition(std::string msg) { return Status(Code::kFailedPrecondition, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(Code::kInternal, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(Code::kUnavailable, std::move(msg)); }
  static Status Aborted(std::string msg) { return Status(Code::kAborted, std::move(msg)); }
  static Status Cancelled(std::string msg) { return Status(Code::kCancelled, std::move(msg)); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  // "ok" or the message; the message already names what and where.
  std::string ToString() const { return ok() ? "ok" : message_; }

  // Prefixes context ("loading config: ") to an error; no-op on OK.
  Status WithContext(const std::string& context) const {
    return ok() ? *this : Status(code_, context + message_);
  }

 private:
  Status(Code code, std::string msg) : code_(code), message_(std::move(msg)) {}
  Code code_ = Code::kOk;
  std::string message_;
};

// Either a value or a non-OK Status.
template <typename T>
class StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {}  // NOLINT
  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() { return *value_; }
  const T& operator*() const { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace herd

#define HERD_CONCAT_INNER(a, b) a##b
#define HERD_CONCAT(a, b) HERD_CONCAT_INNER(a, b)

// Returns from the enclosing function if `expr` (a Status) is not OK.
#define HERD_RETURN_IF_ERROR(expr)              \
  do {                                          \
    ::herd::Status _herd_st = (expr);           \
    if (!_herd_st.ok()) return _herd_st;        \
  } while (0)

// `lhs = value of expr` (a StatusOr), or return its Status.
#define HERD_ASSIGN_OR_RETURN(lhs, expr) HERD_ASSIGN_OR_RETURN_IMPL(HERD_CONCAT(_herd_so_, __LINE__), lhs, expr)
#define HERD_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
