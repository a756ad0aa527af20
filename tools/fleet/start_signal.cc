#include "tools/fleet/start_signal.h"

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace retrybudget::fleet {

int64_t MonotonicMicros(std::chrono::steady_clock::time_point t) {
  return std::chrono::floor<std::chrono::microseconds>(t.time_since_epoch()).count();
}

std::chrono::steady_clock::time_point FromMonotonicMicros(int64_t micros) {
  return std::chrono::steady_clock::time_point(std::chrono::microseconds(micros));
}

std::string StartSignalLine(int64_t origin_micros) { return absl::StrCat("go ", origin_micros); }

absl::StatusOr<std::chrono::steady_clock::time_point> ParseStartSignal(
    absl::string_view line, std::chrono::steady_clock::time_point now) {
  if (line == "go") return now;
  absl::string_view rest = line;
  int64_t micros = 0;
  if (!absl::ConsumePrefix(&rest, "go ") || !absl::SimpleAtoi(rest, &micros) || micros < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "start signal: '", line, "' is not 'go' or 'go <origin: CLOCK_MONOTONIC microseconds>'"));
  }
  const std::chrono::steady_clock::time_point origin = FromMonotonicMicros(micros);
  if (origin > now) {
    return absl::InvalidArgumentError(
        absl::StrCat("start signal: origin ", micros, " us is after this worker's clock (",
                     MonotonicMicros(now), " us): not this machine's CLOCK_MONOTONIC"));
  }
  return origin;
}

size_t TimelineSliceOf(std::chrono::steady_clock::time_point origin,
                       std::chrono::steady_clock::time_point at,
                       std::chrono::steady_clock::duration slice) {
  if (at <= origin) return 0;
  return static_cast<size_t>((at - origin) / slice);
}

}  // namespace retrybudget::fleet
