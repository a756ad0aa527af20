#include "server/log_rate_limit.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "google/protobuf/stubs/logging.h"

namespace retrybudget {

std::optional<std::string> LogRateLimiter::Admit(absl::string_view line) {
  const absl::Time now = clock_->Now();
  MutexLock lock(&mu_);
  if (now - last_ < interval_) {
    ++held_back_;
    return std::nullopt;
  }
  last_ = now;
  std::string out(line);
  if (held_back_ > 0) absl::StrAppend(&out, " (", held_back_, " more like it held back)");
  held_back_ = 0;
  return out;
}

int64_t LogRateLimiter::held_back() {
  MutexLock lock(&mu_);
  return held_back_;
}

namespace {

struct ProtobufLogRoute {
  LogRateLimiter limiter;
  std::function<void(absl::string_view, absl::string_view)> sink;
};

// Set once by RouteProtobufLogs, never destroyed (protobuf may log until the process ends).
ProtobufLogRoute* route = nullptr;

absl::string_view LevelName(google::protobuf::LogLevel level) {
  switch (level) {
    case google::protobuf::LOGLEVEL_INFO: return "INFO";
    case google::protobuf::LOGLEVEL_WARNING: return "WARNING";
    case google::protobuf::LOGLEVEL_ERROR: return "ERROR";
    case google::protobuf::LOGLEVEL_FATAL: return "FATAL";
  }
  return "LOG";
}

void HandleProtobufLog(google::protobuf::LogLevel level, const char* filename, int line,
                       const std::string& message) {
  // A FATAL line is the library's last word before it aborts: never held back.
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    route->sink(LevelName(level), absl::StrCat("protobuf ", filename, ":", line, ": ", message));
    return;
  }
  if (std::optional<std::string> out = route->limiter.Admit(
          absl::StrCat("protobuf ", filename, ":", line, ": ", message))) {
    route->sink(LevelName(level), *out);
  }
}

}  // namespace

void RouteProtobufLogs(absl::Duration interval,
                       std::function<void(absl::string_view, absl::string_view)> sink) {
  route = new ProtobufLogRoute{LogRateLimiter(interval), std::move(sink)};
  google::protobuf::SetLogHandler(&HandleProtobufLog);
}

}  // namespace retrybudget
