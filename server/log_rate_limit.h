// At most one log line per interval from a source that a client can trigger at will.
//
// The protobuf library logs an ERROR line for every string field with invalid UTF-8 that it
// parses, so each malformed Sync would write a line: a hostile client could fill the server's log
// (and its disk). RouteProtobufLogs() sends the library's lines through a LogRateLimiter instead.
//
//   LogRateLimiter limit(absl::Seconds(10));
//   if (std::optional<std::string> line = limit.Admit(message)) logger->warn(*line);
//
// The first line passes; lines within `interval` of the last one that passed are counted, not
// written; the next line that passes says how many were held back ("... (37 more like it held
// back)"). Thread-safe.
#ifndef RETRYBUDGET_SERVER_LOG_RATE_LIMIT_H_
#define RETRYBUDGET_SERVER_LOG_RATE_LIMIT_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"

namespace retrybudget {

class LogRateLimiter {
 public:
  explicit LogRateLimiter(absl::Duration interval, Clock* clock = Clock::Real())
      : interval_(interval), clock_(clock) {}

  // The line to write now, or nullopt when `line` is held back.
  std::optional<std::string> Admit(absl::string_view line);

  // Lines held back since the last one that passed.
  int64_t held_back();

 private:
  const absl::Duration interval_;
  Clock* const clock_;
  Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int64_t held_back_ ABSL_GUARDED_BY(mu_) = 0;
};

// Sends the protobuf library's own log lines to `sink` (with the library's level name: "ERROR",
// "WARNING", ...) through a LogRateLimiter of `interval`, for the rest of the process. Call once,
// at start-up, before any parsing (protobuf's handler is process-wide and not thread-safe to set).
void RouteProtobufLogs(absl::Duration interval,
                       std::function<void(absl::string_view level, absl::string_view line)> sink);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_LOG_RATE_LIMIT_H_
