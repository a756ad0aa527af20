// The shared test main (test_main.cc): a suite whose SetUpTestSuite() fails makes its tests
// fail, as gtest alone would only skip them (and CTest count them passed).
#include <string>

#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#ifndef SUITE_SETUP_FAILURE_PROBE
#error "SUITE_SETUP_FAILURE_PROBE must name the probe binary"
#endif

namespace retrybudget {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(TestMainTest, FailedSuiteSetUpFailsItsTestsInsteadOfSkippingThem) {
  auto probe = Subprocess::Spawn({SUITE_SETUP_FAILURE_PROBE}, {.pipe_stdout = true});
  ASSERT_TRUE(probe.ok()) << probe.status();
  std::string output;
  while (true) {
    absl::StatusOr<std::string> line = (*probe)->ReadLine(absl::Now() + absl::Seconds(30));
    if (!line.ok()) break;
    output += *line + "\n";
  }
  const absl::StatusOr<int> status = (*probe)->Wait(absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_NE(*status, 0) << output;
  EXPECT_THAT(output, HasSubstr("[  FAILED  ] SetUpFails.NeverRuns")) << output;
  EXPECT_THAT(output, Not(HasSubstr("[  SKIPPED ]"))) << output;
}

}  // namespace
}  // namespace retrybudget
