#include "retrybudget/recent_extreme.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace retrybudget {
namespace {

struct Max {
  uint64_t operator()(uint64_t a, uint64_t b) const { return std::max(a, b); }
};
using RecentMax = RecentExtreme<uint64_t, Max, 60'000>;

const absl::Time kT0 = absl::FromUnixSeconds(1'000'000);
constexpr absl::Duration kWindow = RecentMax::kWindow;

TEST(RecentExtremeTest, NothingNotedIsNothing) {
  RecentMax m;
  EXPECT_EQ(m.Get(kT0), std::nullopt);
}

TEST(RecentExtremeTest, KeepsTheLargestOfTheWindowThenForgetsIt) {
  RecentMax m;
  m.Note(4, kT0);
  m.Note(1, kT0 + absl::Seconds(3));  // a fleet seen rejoining one by one after a hang
  EXPECT_EQ(m.Get(kT0 + absl::Seconds(3)), 4u);
  EXPECT_EQ(m.Get(kT0 + kWindow), 4u);  // exactly one window old: still covered
  m.Note(1, kT0 + 2 * kWindow);
  m.Note(1, kT0 + 3 * kWindow);
  EXPECT_EQ(m.Get(kT0 + 3 * kWindow), 1u);
}

TEST(RecentExtremeTest, AnIdleGapLongerThanTwoWindowsForgetsEverything) {
  RecentMax m;
  m.Note(7, kT0);
  EXPECT_EQ(m.Get(kT0 + 2 * kWindow + absl::Seconds(1)), std::nullopt);
}

TEST(RecentExtremeTest, AClockThatGoesBackRollsNothing) {
  RecentMax m;
  m.Note(5, kT0);
  m.Note(2, kT0 - absl::Hours(1));
  EXPECT_EQ(m.Get(kT0 - absl::Hours(1)), 5u);
}

TEST(RecentExtremeTest, MergesWithAnyConservativeRule) {
  struct ComponentwiseMin {
    std::pair<double, double> operator()(std::pair<double, double> a,
                                         std::pair<double, double> b) const {
      return {std::min(a.first, b.first), std::min(a.second, b.second)};
    }
  };
  RecentExtreme<std::pair<double, double>, ComponentwiseMin, 60'000> m;
  m.Note({5, 15}, kT0);
  m.Note({6.5, 12}, kT0 + absl::Seconds(1));
  EXPECT_EQ(m.Get(kT0 + absl::Seconds(1)), std::make_pair(5.0, 12.0));
}

// Against a brute force over random histories: Get(now) covers every value of the last window
// and nothing older than two windows.
TEST(RecentExtremeTest, CoversTheLastWindowAndNothingOlderThanTwo) {
  std::mt19937_64 rng(20261202);
  for (int history = 0; history < 200; ++history) {
    RecentMax m;
    std::vector<std::pair<absl::Time, uint64_t>> noted;
    absl::Time now = kT0;
    for (int step = 0; step < 300; ++step) {
      now += absl::Milliseconds(std::uniform_int_distribution<int>(0, 40'000)(rng));
      if (rng() % 3 != 0) {
        const uint64_t v = rng() % 1000;
        m.Note(v, now);
        noted.emplace_back(now, v);
      }
      const std::optional<uint64_t> got = m.Get(now);
      uint64_t must_cover = 0;
      bool any_recent = false;
      uint64_t may_reach = 0;
      bool any_possible = false;
      for (const auto& [at, v] : noted) {
        if (now - at <= kWindow) {
          must_cover = std::max(must_cover, v);
          any_recent = true;
        }
        if (now - at < 2 * kWindow) {
          may_reach = std::max(may_reach, v);
          any_possible = true;
        }
      }
      if (any_recent) {
        ASSERT_TRUE(got.has_value()) << "history " << history << " step " << step;
        EXPECT_GE(*got, must_cover) << "history " << history << " step " << step;
      }
      if (got.has_value()) {
        ASSERT_TRUE(any_possible) << "history " << history << " step " << step;
        EXPECT_LE(*got, may_reach) << "history " << history << " step " << step;
      }
    }
  }
}

}  // namespace
}  // namespace retrybudget
