// Not a test of its own: a suite whose SetUpTestSuite() fails, run by test_main_test, which
// checks that its tests count as failed rather than skipped.
#include "gtest/gtest.h"

namespace {

class SetUpFails : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { FAIL() << "the suite set-up fails on purpose"; }
};

TEST_F(SetUpFails, NeverRuns) {}

}  // namespace
