// The main() of every test binary: gtest's, plus one rule gtest lacks. When a suite's
// SetUpTestSuite() fails, gtest marks each of its tests SKIPPED, and CTest (through
// gtest_discover_tests' skip pattern) counts a skipped test as passed. Here each such test gets
// a failure of its own instead, so a broken suite set-up fails the run wherever it runs.
#include "gtest/gtest.h"

namespace {

class SuiteSetUpFailureIsATestFailure : public ::testing::EmptyTestEventListener {
 public:
  void OnTestStart(const ::testing::TestInfo& test) override {
    const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
    if (suite != nullptr && suite->ad_hoc_test_result().Failed()) {
      // Reported while gtest skips `test`, so it lands in that test's result: FAILED, not
      // SKIPPED.
      ADD_FAILURE() << "SetUpTestSuite() of " << test.test_suite_name()
                    << " failed (see above), so " << test.name() << " could not run";
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  ::testing::UnitTest::GetInstance()->listeners().Append(new SuiteSetUpFailureIsATestFailure());
  return RUN_ALL_TESTS();
}
