// Workers of other languages in a fleet run: the --foreign-workers flag, where each worker goes
// (index, tenant, argv), its protocol line read into the fleet's counts, and the per-language
// sums of the report; the start signal every worker counts its timelines from, and what a late
// worker's timeline does to the ideal bucket. No processes here (fleet_languages_test runs the
// real ones).
#include "tools/fleet/foreign_worker.h"

#include <time.h>

#include <chrono>
#include <string>
#include <vector>

#include "tools/fleet/start_signal.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace retrybudget::fleet {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(ParseForeignWorkerKindTest, SplitsLanguageCountAndCommand) {
  absl::StatusOr<ForeignWorkerKind> kind =
      ParseForeignWorkerKind("python:3:/usr/bin/python3 /x/mixed_fleet.py --worker");
  ASSERT_TRUE(kind.ok()) << kind.status();
  EXPECT_EQ(kind->language, "python");
  EXPECT_EQ(kind->count, 3);
  EXPECT_THAT(kind->command, ElementsAre("/usr/bin/python3", "/x/mixed_fleet.py", "--worker"));
}

TEST(ParseForeignWorkerKindTest, RefusesBadSpecsNamingTheFlagAndValue) {
  for (const char* spec : {"go", "go:2", "Go:2:/bin/w", "cpp:2:/bin/w", "go:0:/bin/w",
                           "go:x:/bin/w", "go:2:", "go:2:   ", ":2:/bin/w"}) {
    absl::StatusOr<ForeignWorkerKind> kind = ParseForeignWorkerKind(spec);
    ASSERT_FALSE(kind.ok()) << spec;
    EXPECT_THAT(kind.status().message(), HasSubstr("--foreign-workers"));
    EXPECT_THAT(kind.status().message(), HasSubstr(spec));
  }
}

TEST(PlanForeignWorkersTest, FollowTheCppWorkersAndSpreadOverTheTenants) {
  const std::vector<ForeignWorkerKind> kinds = {{.language = "go", .count = 2, .command = {"/g"}},
                                                {.language = "js", .count = 2,
                                                 .command = {"/node", "w.mjs"}}};
  const std::vector<ForeignWorker> plan =
      PlanForeignWorkers(kinds, {.target = "ipv4:127.0.0.1:1,127.0.0.1:2",
                                 .tenant = "t",
                                 .tenants = 3,
                                 .cpp_workers = 4,
                                 .threads = 2,
                                 .duration_seconds = 6,
                                 .failure_rate = 0.5,
                                 .call_latency = absl::Milliseconds(2),
                                 .seed = 10,
                                 .timeline_slice = absl::Milliseconds(100)});
  ASSERT_EQ(plan.size(), 4u);
  EXPECT_EQ(plan[0].language, "go");
  EXPECT_EQ(plan[3].language, "js");
  EXPECT_EQ(plan[0].index, 4);
  EXPECT_EQ(plan[3].index, 7);
  // Worker k of every kind on tenant k % 3.
  EXPECT_EQ(plan[0].tenant_index, 0);
  EXPECT_EQ(plan[1].tenant_index, 1);
  EXPECT_EQ(plan[2].tenant_index, 2);
  EXPECT_EQ(plan[3].tenant_index, 0);
  EXPECT_THAT(plan[3].argv,
              ElementsAre("/node", "w.mjs", "--server=ipv4:127.0.0.1:1,127.0.0.1:2",
                          "--tenant=t-0", "--threads=2", "--duration=6", "--failure-rate=0.5",
                          "--call-latency=0.002", "--seed=17", "--timeline-slice=0.1"));
}

constexpr char kLine[] =
    R"({"calls":10,"attempts":18,"successes":6,"failures":4,"retries_allowed":8,)"
    R"("retries_denied":4,"lib_retries_allowed":8,"lib_fallback_allowed":2,"lib_tokens_held":0,)"
    R"("lib_successes_credited_locally":1,"fallback_allowance":3.5,"saw_fallback":true,)"
    R"("lease_after_fallback":true,"shutdown_status":"OK","max_try_acquire_ms":0.02,)"
    R"("timeline_slice_seconds":0.1,"calls_timeline":[6,4],"retries_timeline":[5,3],)"
    R"("denied_timeline":[1,3],"successes_timeline":[4,2]})";

TEST(ForeignWorkerCountsTest, ReadsTheProtocolLineIntoTheFleetsCounts) {
  absl::StatusOr<WorkerCounts> c = ForeignWorkerCountsFromJson(kLine, 5, 2, 0.1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->worker, 5);
  EXPECT_EQ(c->tenant_index, 2);
  EXPECT_EQ(c->calls, 10u);
  EXPECT_EQ(c->successes, 6u);
  EXPECT_EQ(c->retries_allowed, 8u);
  EXPECT_EQ(c->retries_denied, 4u);
  EXPECT_EQ(c->lib_fallback_allowed, 2u);
  EXPECT_EQ(c->lib_successes_credited_locally, 1u);
  EXPECT_DOUBLE_EQ(c->fallback_allowance, 3.5);
  EXPECT_EQ(c->lease_after_fallback, 1u);
  EXPECT_EQ(c->shutdown_status, "OK");
  EXPECT_THAT(c->retries_timeline, ElementsAre(5, 3));
  EXPECT_THAT(c->denied_timeline, ElementsAre(1, 3));
  EXPECT_THAT(c->successes_timeline, ElementsAre(4, 2));
  // A line of the fleet's own format, so --worker-lines and the sums take it as any other.
  absl::StatusOr<WorkerCounts> again = WorkerCountsFromJson(WorkerCountsToJson(*c));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->retries_allowed, 8u);
}

TEST(ForeignWorkerCountsTest, ReadsTheCostRequestsAndShadowFieldsAndDefaultsThemToCostOne) {
  // Without them: every retry cost 1 token, counted at its call's start.
  absl::StatusOr<WorkerCounts> c = ForeignWorkerCountsFromJson(kLine, 0, 0, 0.1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->tokens_spent, 8u);
  EXPECT_THAT(c->tokens_timeline, ElementsAre(5, 3));
  EXPECT_EQ(c->requests, 0u);
  std::string line = kLine;
  line.insert(line.size() - 1,
              R"(,"requests":10,"tokens_spent":40,"lib_requests":10,"lib_shadow_denied":3,)"
              R"("requests_timeline":[6,4],"tokens_timeline":[0,25,15])");
  c = ForeignWorkerCountsFromJson(line, 0, 0, 0.1);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->requests, 10u);
  EXPECT_EQ(c->tokens_spent, 40u);
  EXPECT_EQ(c->lib_requests, 10u);
  EXPECT_EQ(c->lib_shadow_denied, 3u);
  EXPECT_THAT(c->requests_timeline, ElementsAre(6, 4));
  EXPECT_THAT(c->tokens_timeline, ElementsAre(0, 25, 15));
  // Present but malformed: refused, naming the field.
  std::string bad = kLine;
  bad.insert(bad.size() - 1, R"(,"tokens_spent":-1)");
  c = ForeignWorkerCountsFromJson(bad, 0, 0, 0.1);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("tokens_spent"));
}

TEST(ForeignWorkerCountsTest, RefusesAMissingFieldOrAnotherSlice) {
  std::string no_timeline = kLine;
  no_timeline.replace(no_timeline.find("\"retries_timeline\""), 18, "\"other\"");
  absl::StatusOr<WorkerCounts> c = ForeignWorkerCountsFromJson(no_timeline, 0, 0, 0.1);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("retries_timeline"));
  c = ForeignWorkerCountsFromJson(kLine, 0, 0, 0.25);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("timeline_slice_seconds"));
  c = ForeignWorkerCountsFromJson("not json", 0, 0, 0.1);
  EXPECT_FALSE(c.ok());
}

TEST(ForeignWorkerCountsTest, ChecksTheTimelineOriginAgainstTheStartSignal) {
  std::string line = kLine;
  line.insert(line.size() - 1, R"(,"timeline_origin_us":3287851894)");
  absl::StatusOr<WorkerCounts> c = ForeignWorkerCountsFromJson(line, 0, 0, 0.1, 3287851894);
  EXPECT_TRUE(c.ok()) << c.status();
  c = ForeignWorkerCountsFromJson(line, 0, 0, 0.1, 3287851000);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("'timeline_origin_us' is 3287851894"));
  EXPECT_THAT(c.status().message(), HasSubstr("3287851000"));
  // A worker that does not echo the origin (an older one: its own start) is refused too.
  c = ForeignWorkerCountsFromJson(kLine, 0, 0, 0.1, 3287851894);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("timeline_origin_us"));
}

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

TEST(StartSignalTest, CarriesTheFleetsStartAsTheTimelinesOrigin) {
  EXPECT_EQ(StartSignalLine(1234567), "go 1234567");
  const Clock::time_point now = FromMonotonicMicros(2000000);
  absl::StatusOr<Clock::time_point> origin = ParseStartSignal("go 1234567", now);
  ASSERT_TRUE(origin.ok()) << origin.status();
  EXPECT_EQ(MonotonicMicros(*origin), 1234567);
  // A bare "go" (mixed_fleet.py's workers' own tests): from the moment it is read.
  origin = ParseStartSignal("go", now);
  ASSERT_TRUE(origin.ok()) << origin.status();
  EXPECT_EQ(*origin, now);
  for (const char* bad : {"stop", "go ", "go x", "go -5", "go 12 13", "go 1.5"}) {
    origin = ParseStartSignal(bad, now);
    ASSERT_FALSE(origin.ok()) << bad;
    EXPECT_THAT(origin.status().message(), HasSubstr(bad));
  }
  origin = ParseStartSignal("go 2000001", now);
  ASSERT_FALSE(origin.ok());
  EXPECT_THAT(origin.status().message(), HasSubstr("after this worker's clock"));
  // Rounded down: the origin is never after the instant it stands for, so no call is counted
  // in a slice before the one it started in.
  EXPECT_EQ(MonotonicMicros(Clock::time_point(std::chrono::nanoseconds(5999))), 5);
}

TEST(StartSignalTest, MonotonicMicrosIsCLOCK_MONOTONIC) {
  // What the Go, Node and Python workers read (clock_gettime, process.hrtime, time.monotonic).
  timespec ts{};
  ASSERT_EQ(clock_gettime(CLOCK_MONOTONIC, &ts), 0);
  const int64_t theirs = int64_t{ts.tv_sec} * 1000000 + ts.tv_nsec / 1000;
  const int64_t ours = MonotonicMicros(Clock::now());
  EXPECT_GE(ours, theirs);
  EXPECT_LT(ours - theirs, 1000000);  // the same clock, read twice (not a speed assertion)
}

// A worker that began calling 230 ms after the fleet's start (its client made late, as the Node
// worker's is) counts on the fleet's grid: its first call, at 0.23 s, is in slice 2; a call
// 99 ms after its own start (its own slice 0) is in slice 3; its last, 4.0 s after its start,
// in slice 42, not 40.
TEST(TimelineSliceTest, ALateWorkerCountsOnTheFleetsGrid) {
  const Clock::time_point t0 = FromMonotonicMicros(1000000000);
  const Clock::duration slice = milliseconds(100);
  const Clock::time_point begin = t0 + milliseconds(230);
  EXPECT_EQ(TimelineSliceOf(t0, t0, slice), 0u);
  EXPECT_EQ(TimelineSliceOf(t0, t0 + milliseconds(99), slice), 0u);
  EXPECT_EQ(TimelineSliceOf(t0, t0 + milliseconds(100), slice), 1u);
  EXPECT_EQ(TimelineSliceOf(t0, begin, slice), 2u);
  EXPECT_EQ(TimelineSliceOf(t0, begin + milliseconds(99), slice), 3u);
  EXPECT_EQ(TimelineSliceOf(t0, begin + milliseconds(3999), slice), 42u);
  EXPECT_EQ(TimelineSliceOf(t0, t0 - milliseconds(1), slice), 0u);
}

// The ideal bucket of a fleet with a late worker, by hand. Capacity 1, refill 10/s, slices of
// 0.1 s (one token each), bucket empty at the start, no credit; the run lasts 0.6 s, so a
// central bucket hands out at most 6. Worker A calls from the start and retries once in each
// of its 4 slices (0-0.4 s); worker B starts 0.2 s late and retries 3 times in its last slice
// (0.5-0.6 s of the run). Together they send 6 retries, each of which a central bucket had.
//
// On the fleet's grid: demand 1,1,1,1,0,3. Slices 0-3 spend their token; slice 4 banks one
// (capacity 1); slice 5 has 1 + 1: the ideal allows 4 + 2 = 6, and 6 spent read 1.0.
// With B's slices from its own start (the old way) the demand reads 1,1,1,4 in 0.4 s, the
// 0.2 s left over goes to a bucket already full, and slice 3 has 2 for 4: 5, and 6 read 1.2.
TEST(TimelineSliceTest, ALateWorkerOnTheFleetsGridKeepsTheIdealExact) {
  const Clock::time_point t0 = FromMonotonicMicros(1000000000);
  const Clock::duration slice = milliseconds(100);
  auto place = [&](Clock::time_point origin, const std::vector<Clock::time_point>& retries) {
    WorkerCounts w;
    w.timeline_slice_seconds = 0.1;
    for (Clock::time_point at : retries) {
      const size_t i = TimelineSliceOf(origin, at, slice);
      if (w.retries_timeline.size() <= i) {
        w.retries_timeline.resize(i + 1, 0);
        w.calls_timeline.resize(i + 1, 0);
      }
      ++w.retries_timeline[i];
      ++w.calls_timeline[i];
    }
    w.retries_allowed = retries.size();
    return w;
  };
  const std::vector<Clock::time_point> a = {t0 + milliseconds(10), t0 + milliseconds(110),
                                            t0 + milliseconds(210), t0 + milliseconds(310)};
  const Clock::time_point b_start = t0 + milliseconds(200);
  const std::vector<Clock::time_point> b(3, b_start + milliseconds(350));
  const PolicyView policy = {.capacity = 1, .refill_per_second = 10, .initial_tokens = 0};

  const WorkerCounts aligned = SumWorkers({place(t0, a), place(t0, b)});
  EXPECT_THAT(aligned.retries_timeline, ElementsAre(1, 1, 1, 1, 0, 3));
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, /*elapsed_seconds=*/0.6, aligned), 6);

  const WorkerCounts own_start = SumWorkers({place(t0, a), place(b_start, b)});
  EXPECT_THAT(own_start.retries_timeline, ElementsAre(1, 1, 1, 4));
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, 0.6, own_start), 5);
}

TEST(SumByLanguageTest, SumsEachLanguagesLines) {
  const std::vector<ForeignWorker> foreign = {{.language = "go", .index = 2},
                                              {.language = "python", .index = 3},
                                              {.language = "go", .index = 4}};
  std::vector<WorkerCounts> counts(5);
  for (int i = 0; i < 5; ++i) {
    counts[static_cast<size_t>(i)].worker = i;
    counts[static_cast<size_t>(i)].retries_allowed = static_cast<uint64_t>(10 * (i + 1));
    counts[static_cast<size_t>(i)].shutdown_status = "OK";
  }
  // The C++ worker 1 printed two lines (two tenants).
  counts.push_back(counts[1]);
  const std::vector<LanguageRun> languages = SumByLanguage(counts, 2, foreign);
  ASSERT_EQ(languages.size(), 3u);
  EXPECT_EQ(languages[0].language, "cpp");
  EXPECT_EQ(languages[0].workers, 2);
  EXPECT_EQ(languages[0].totals.retries_allowed, 10u + 20u + 20u);
  EXPECT_EQ(languages[1].language, "go");
  EXPECT_EQ(languages[1].workers, 2);
  EXPECT_EQ(languages[1].totals.retries_allowed, 30u + 50u);
  EXPECT_EQ(languages[2].language, "python");
  EXPECT_EQ(languages[2].totals.retries_allowed, 40u);
}

}  // namespace
}  // namespace retrybudget::fleet
