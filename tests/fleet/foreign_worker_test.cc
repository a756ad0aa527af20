// Workers of other languages in a fleet run: the --foreign-workers flag, where each worker goes
// (index, tenant, argv), its protocol line read into the fleet's counts, and the per-language
// sums of the report. No processes here (fleet_languages_test runs the real ones).
#include "tools/fleet/foreign_worker.h"

#include <string>
#include <vector>

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
