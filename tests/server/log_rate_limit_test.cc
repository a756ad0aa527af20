#include "server/log_rate_limit.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/stubs/logging.h"
#include "gtest/gtest.h"
#include "retrybudget/clock.h"

namespace retrybudget {
namespace {

using ::testing::HasSubstr;

TEST(LogRateLimiterTest, FirstLinePassesTheRestOfTheIntervalIsCountedAndReported) {
  FakeClock clock;
  LogRateLimiter limit(absl::Seconds(10), &clock);
  EXPECT_EQ(limit.Admit("bad request"), "bad request");
  for (int i = 0; i < 1000; ++i) {
    clock.Advance(absl::Milliseconds(5));
    EXPECT_EQ(limit.Admit("bad request"), std::nullopt) << i;
  }
  EXPECT_EQ(limit.held_back(), 1000);
  clock.Advance(absl::Seconds(5));  // 10 s after the first line
  EXPECT_EQ(limit.Admit("bad request"), "bad request (1000 more like it held back)");
  EXPECT_EQ(limit.held_back(), 0);
  clock.Advance(absl::Seconds(10));
  EXPECT_EQ(limit.Admit("another"), "another");
}

TEST(RouteProtobufLogsTest, TheLibrarysLinesGoToTheSinkAtMostOncePerInterval) {
  std::vector<std::string> lines;
  RouteProtobufLogs(absl::Hours(1), [&](absl::string_view level, absl::string_view line) {
    lines.push_back(std::string(level) + " " + std::string(line));
  });
  for (int i = 0; i < 100; ++i) GOOGLE_LOG(ERROR) << "String field contains invalid UTF-8 " << i;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("ERROR protobuf "));
  EXPECT_THAT(lines[0], HasSubstr("invalid UTF-8 0"));
  google::protobuf::SetLogHandler(nullptr);
}

}  // namespace
}  // namespace retrybudget
