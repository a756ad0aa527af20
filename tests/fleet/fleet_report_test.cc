// The verdict of a fleet run: the bound of DESIGN.md, within_budget, utilisation, the exit code,
// and the JSON lines. These are what make the fleet tests able to fail.
#include "tools/fleet/fleet_report.h"

#include <algorithm>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace retrybudget::fleet {
namespace {

using ::testing::HasSubstr;

google::protobuf::Struct ParseJson(const std::string& line) {
  google::protobuf::Struct s;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(line, &s).ok()) << line;
  return s;
}

FleetRun RunWith(uint64_t retries_allowed, uint64_t successes, double elapsed) {
  FleetRun run;
  run.tenant = "t";
  run.strategy = "budget";
  run.workers = 8;
  run.threads = 2;
  run.failure_rate = 0.3;
  run.policy = {.capacity = 20, .refill_per_second = 50, .success_credit = 0.01,
                .initial_tokens = 20, .lease_ttl_ms = 5000};
  run.elapsed_seconds = elapsed;
  run.totals.retries_allowed = retries_allowed;
  run.totals.tokens_spent = retries_allowed;  // cost 1
  run.totals.successes = successes;
  run.totals.shutdown_status = "OK";
  return run;
}

TEST(BudgetBoundTest, IsInitialPlusRefillTimesElapsedPlusCreditTimesSuccesses) {
  PolicyView p{.capacity = 20, .refill_per_second = 50, .success_credit = 0.01,
               .initial_tokens = 17.5};
  EXPECT_DOUBLE_EQ(BudgetBound(p, 4.0, 10'000), 17.5 + 200 + 100);
  EXPECT_DOUBLE_EQ(BudgetBound(p, 0, 0), 17.5);
}

TEST(JudgeTest, SpendingAtTheBoundIsWithinBudgetWithFullUtilisation) {
  Verdict v = Judge(RunWith(/*retries_allowed=*/320, /*successes=*/10'000, /*elapsed=*/4.0));
  EXPECT_DOUBLE_EQ(v.bound, 320);
  EXPECT_TRUE(v.within_budget);
  EXPECT_DOUBLE_EQ(v.utilisation, 1.0);
  EXPECT_EQ(ExitCodeFor(v), kExitWithinBudget);
}

TEST(JudgeTest, OneRetryOverTheBoundIsExceededAndExitsNonZero) {
  Verdict v = Judge(RunWith(/*retries_allowed=*/321, /*successes=*/10'000, /*elapsed=*/4.0));
  EXPECT_FALSE(v.within_budget);
  EXPECT_GT(v.utilisation, 1.0);
  EXPECT_EQ(ExitCodeFor(v), kExitBudgetExceeded);
  EXPECT_NE(ExitCodeFor(v), 0);
  EXPECT_THAT(FleetReportToJson(RunWith(321, 10'000, 4.0), v),
              HasSubstr("\"within_budget\":false"));
}

TEST(JudgeTest, UnderSpendingIsWithinBudgetWithLowUtilisation) {
  Verdict v = Judge(RunWith(/*retries_allowed=*/160, /*successes=*/10'000, /*elapsed=*/4.0));
  EXPECT_TRUE(v.within_budget);
  EXPECT_DOUBLE_EQ(v.utilisation, 0.5);
}

TEST(JudgeTest, ZeroBoundWithSpendingIsExceededAndUtilisationPrintsAsNull) {
  FleetRun run = RunWith(1, 0, 0);
  run.policy = {};
  Verdict v = Judge(run);
  EXPECT_FALSE(v.within_budget);
  EXPECT_EQ(v.utilisation, std::numeric_limits<double>::infinity());
  EXPECT_THAT(FleetReportToJson(run, v), HasSubstr("\"utilisation\":null"));
}

TEST(JudgeTest, TheBoundCountsTokensNotRetries) {
  // 12 retries of cost 5 = 60 tokens > bound 20 + 50 * 0.5 = 45.
  FleetRun run = RunWith(/*retries_allowed=*/12, /*successes=*/0, /*elapsed=*/0.5);
  run.retry_cost = 5;
  run.totals.tokens_spent = 60;
  const Verdict v = Judge(run);
  EXPECT_EQ(v.spent, 60);
  EXPECT_FALSE(v.within_budget);
  run.totals.tokens_spent = 45;
  EXPECT_TRUE(Judge(run).within_budget);
}

TEST(JudgeTest, AShadowRunsWouldBeDenialsTookNoTokenAndAreNotJudgedAsSpent) {
  // 100 retries let through at cost 2, 80 of them would-be denials: 40 tokens taken.
  FleetRun run = RunWith(/*retries_allowed=*/100, /*successes=*/0, /*elapsed=*/0.5);
  run.policy.mode = "shadow";
  run.retry_cost = 2;
  run.totals.tokens_spent = 200;
  run.totals.lib_shadow_denied = 80;
  const Verdict v = Judge(run);
  EXPECT_EQ(v.spent, 40);
  EXPECT_TRUE(v.within_budget);  // 40 <= 45
}

// A windowed policy of 10 tokens/s floor over a 1 s window, ratio 0.5, slices of 0.1 s.
PolicyView Windowed() {
  return {.mode = "enforce", .windowed = true, .retry_ratio = 0.5,
          .min_retries_per_second = 10, .ttl_ms = 1000};
}

WorkerCounts Timelines(std::vector<uint64_t> requests, std::vector<uint64_t> tokens) {
  WorkerCounts c;
  c.timeline_slice_seconds = 0.1;
  c.requests_timeline = std::move(requests);
  c.tokens_timeline = std::move(tokens);
  return c;
}

TEST(CheckWindowedBoundTest, EveryWindowEndingAtASpendIsWithinFloorPlusRatioTimesRequests) {
  // 10 tokens in slice 0 (the floor of a window), then 20 requests in slice 5 fund 10 more in
  // slice 12: its window (0.3, 1.3] holds those 10, bound 10 + 0.5 * 20 = 20.
  std::vector<uint64_t> requests(13, 0), tokens(13, 0);
  tokens[0] = 10;
  requests[5] = 20;
  tokens[12] = 10;
  const WindowedCheck c = CheckWindowedBound(Windowed(), Timelines(requests, tokens),
                                             /*report_delay_seconds=*/0, 0);
  EXPECT_TRUE(c.checked);
  EXPECT_EQ(c.windows, 2);
  EXPECT_TRUE(c.within);
  EXPECT_EQ(c.windows_over, 0);
  EXPECT_DOUBLE_EQ(c.floor_tokens, 10);
}

TEST(CheckWindowedBoundTest, SpendingBeyondTheWindowsDepositsIsOver) {
  // 16 tokens within one window with no request: over the floor of 10.
  std::vector<uint64_t> tokens = {6, 0, 0, 10};
  const WindowedCheck c =
      CheckWindowedBound(Windowed(), Timelines({}, tokens), 0, /*fallback_allowance=*/0);
  EXPECT_FALSE(c.within);
  EXPECT_EQ(c.windows_over, 1);
  EXPECT_EQ(c.worst_spent, 16u);
  EXPECT_DOUBLE_EQ(c.worst_bound, 10);
  // The fallback allowance of an outage covers it.
  EXPECT_TRUE(CheckWindowedBound(Windowed(), Timelines({}, tokens), 0, 6).within);
}

TEST(CheckWindowedBoundTest, RequestsMadeUpToTheReportDelayBeforeTheWindowFundIt) {
  // 20 requests in slice 0 fund 20 tokens in slice 14 (its window starts at 0.5 s) only when
  // the report delay D reaches back to slice 0.
  std::vector<uint64_t> requests = {20};
  std::vector<uint64_t> tokens(15, 0);
  tokens[14] = 20;
  EXPECT_FALSE(CheckWindowedBound(Windowed(), Timelines(requests, tokens), 0, 0).within);
  EXPECT_TRUE(CheckWindowedBound(Windowed(), Timelines(requests, tokens), 0.5, 0).within);
}

TEST(CheckWindowedBoundTest, IsNotCheckedForAShadowTenantOrAClassicPolicy) {
  PolicyView shadow = Windowed();
  shadow.mode = "shadow";
  EXPECT_FALSE(CheckWindowedBound(shadow, Timelines({}, {100}), 0, 0).checked);
  EXPECT_FALSE(CheckWindowedBound(PolicyView{}, Timelines({}, {100}), 0, 0).checked);
}

TEST(JudgeTest, AWindowedPolicyIsJudgedByItsWindowedBound) {
  FleetRun run = RunWith(/*retries_allowed=*/21, /*successes=*/0, /*elapsed=*/0.4);
  run.policy = Windowed();
  run.totals.timeline_slice_seconds = 0.1;
  run.totals.tokens_timeline = {11, 0, 0, 10};
  EXPECT_FALSE(Judge(run).within_budget);
  run.totals.tokens_timeline = {5, 0, 0, 5};
  const Verdict v = Judge(run);
  EXPECT_TRUE(v.within_budget);
  EXPECT_TRUE(v.windowed.checked);
  EXPECT_THAT(FleetReportToJson(run, v), HasSubstr("\"windowed\":{\"checked\":true"));
}

TEST(SumWorkersTest, ModeChangesAreWhenTheLastClientSawEach) {
  WorkerCounts a, b;
  a.mode_changes_ms = {100, 2300};
  b.mode_changes_ms = {150, 2200, 4100};
  EXPECT_EQ(SumWorkers({a, b}).mode_changes_ms, (std::vector<uint64_t>{150, 2300, 4100}));
}

TEST(IdealAllowedTest, TakesWholeRetriesOfTheirCostInTokens) {
  const PolicyView policy = {.capacity = 20, .refill_per_second = 0, .success_credit = 0,
                             .initial_tokens = 20, .lease_ttl_ms = 1000};
  WorkerCounts totals;
  totals.timeline_slice_seconds = 0.1;
  totals.retries_timeline = {3};
  totals.denied_timeline = {5};
  // 8 retries of cost 3 ask 24 tokens: 6 whole retries (18 tokens) fit in 20.
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, /*elapsed_seconds=*/0.1, totals, /*retry_cost=*/3), 18);
}

TEST(IdealAllowedTest, ReplaysDemandAndDepositsThroughOneCappedBucket) {
  const PolicyView policy = {.capacity = 10, .refill_per_second = 20, .success_credit = 0.5,
                             .initial_tokens = 10, .lease_ttl_ms = 1000};
  WorkerCounts totals;
  totals.timeline_slice_seconds = 0.5;  // 10 tokens of refill a slice
  // Slice 0: a full bucket and 10 of refill over the slice; demand 30 spread over it takes the
  // 10 at once and each refilled token as it comes: 20, none left.
  // Slice 1: no demand; 10 of refill and 20 successes (10 tokens) fill it to the cap.
  // Slice 2: demand 4 (2 sent, 2 denied): 4, and the bucket full again by the slice's end.
  // Slice 3: 10 + 10 of refill; demand 100 takes those 20.
  totals.retries_timeline = {20, 0, 2, 50};
  totals.denied_timeline = {10, 0, 2, 50};
  totals.successes_timeline = {0, 20, 0, 0};
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, /*elapsed_seconds=*/2, totals), 20 + 0 + 4 + 20);
  // No demand, nothing allowed, whatever the refill.
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, 2, WorkerCounts{}), 0);
  // Refill outside the timeline counts (capped): 0.1 s before slice 0 of an empty bucket.
  PolicyView empty = policy;
  empty.initial_tokens = 0;
  empty.capacity = 100;
  WorkerCounts one;
  one.timeline_slice_seconds = 0.5;
  one.retries_timeline = {100};
  EXPECT_DOUBLE_EQ(IdealAllowed(empty, /*elapsed_seconds=*/0.6, one), 2 + 10);
}

// Every timeline counts from the run's start, so the run's end is known on the slices: a run of
// 4.02 s in 0.1 s slices has calls in slice 40 (4.0-4.1 s), and that slice refills only for
// the 0.02 s inside the run. Capacity 20, full, refill 60/s, demand far above it in every
// slice: a central bucket allows 20 + 60 * 4.02 = 261.2, so 261 whole tokens; giving slice 40
// a whole slice of refill read 266, above what the run could produce.
TEST(IdealAllowedTest, ALastSliceThatEndsAfterTheRunRefillsOnlyInsideIt) {
  const PolicyView policy = {.capacity = 20, .refill_per_second = 60, .success_credit = 0,
                             .initial_tokens = 20, .lease_ttl_ms = 1000};
  WorkerCounts totals;
  totals.timeline_slice_seconds = 0.1;
  totals.retries_timeline.assign(41, 6);
  totals.denied_timeline.assign(41, 20);
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, /*elapsed_seconds=*/4.02, totals), 261);
  // The run as long as its slices: every slice whole.
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, /*elapsed_seconds=*/4.1, totals), 20 + 246);
}

// The case where the ideal allowed too little when a slice's deposits met the cap before its
// demand took them: capacity 10, full at the start, refill 20/s, a retry asked every 25 ms for
// one second (t = 0, 25, ..., 975 ms). Event by event, by hand: the bucket's 10 go to the first
// demands, then every whole token refilled by the time of a demand: by 975 ms, 19.5 refilled,
// so 10 + 19 = 29 allowed. In 100 ms slices (4 demands and 2 tokens of refill each), capping
// each slice's deposits first read 28, below the central bucket; the replay reads 30 (the
// fraction of the last token is the timeline's blur, on the generous side).
TEST(IdealAllowedTest, IsNotBelowAnEventByEventCentralBucketWhenDepositsMeetTheCapacity) {
  const PolicyView policy = {.capacity = 10, .refill_per_second = 20, .success_credit = 0,
                             .initial_tokens = 10, .lease_ttl_ms = 1000};
  WorkerCounts sliced;
  sliced.timeline_slice_seconds = 0.1;
  sliced.retries_timeline.assign(10, 2);
  sliced.denied_timeline.assign(10, 2);
  EXPECT_DOUBLE_EQ(IdealAllowed(policy, /*elapsed_seconds=*/1.0, sliced), 30);
}

// A central bucket driven event by event (continuous refill, a success's credit when it happens,
// a demand allowed when a whole token is there), for random runs; the replay of the same events
// in slices never allows less, whatever the slice.
TEST(IdealAllowedTest, IsAnUpperBoundOfAnEventByEventCentralBucketForRandomRuns) {
  std::mt19937_64 rng(20261207);
  for (int run = 0; run < 300; ++run) {
    const PolicyView policy = {
        .capacity = static_cast<double>(1 + rng() % 20),
        .refill_per_second = static_cast<double>(rng() % 50),
        .success_credit = static_cast<double>(rng() % 5) / 10,
        .initial_tokens = static_cast<double>(rng() % 21),
        .lease_ttl_ms = 1000};
    const double slice = std::vector<double>{0.01, 0.1, 0.25, 1.0}[rng() % 4];
    const int slices = static_cast<int>(2.0 / slice);
    // Events at whole milliseconds over 2 s: a demand or a success.
    struct Event {
      int ms;
      bool demand;
    };
    std::vector<Event> events;
    const int n = static_cast<int>(rng() % 400);
    for (int i = 0; i < n; ++i) {
      events.push_back({static_cast<int>(rng() % 2000), rng() % 3 != 0});
    }
    std::sort(events.begin(), events.end(),
              [](const Event& a, const Event& b) { return a.ms < b.ms; });
    double level = std::min(policy.initial_tokens, policy.capacity);
    double exact = 0;
    int now_ms = 0;
    WorkerCounts counts;
    counts.timeline_slice_seconds = slice;
    counts.retries_timeline.assign(slices, 0);
    counts.denied_timeline.assign(slices, 0);
    counts.successes_timeline.assign(slices, 0);
    for (const Event& e : events) {
      level = std::min(policy.capacity, level + policy.refill_per_second * (e.ms - now_ms) / 1e3);
      now_ms = e.ms;
      const size_t at = std::min<size_t>(slices - 1, static_cast<size_t>(e.ms / 1e3 / slice));
      if (!e.demand) {
        level = std::min(policy.capacity, level + policy.success_credit);
        ++counts.successes_timeline[at];
      } else if (level >= 1 - 1e-9) {
        level -= 1;
        exact += 1;
        ++counts.retries_timeline[at];
      } else {
        ++counts.denied_timeline[at];
      }
    }
    EXPECT_GE(IdealAllowed(policy, /*elapsed_seconds=*/2.0, counts), exact)
        << "run " << run << ": slice " << slice << ", capacity " << policy.capacity
        << ", refill " << policy.refill_per_second << ", credit " << policy.success_credit;
  }
}

TEST(JudgeTest, UtilisationVsIdealIsRetriesAllowedOverTheIdealBucketsAllowance) {
  FleetRun run = RunWith(/*retries_allowed=*/35, /*successes=*/0, /*elapsed=*/1.0);
  run.totals.timeline_slice_seconds = 1.0;
  run.totals.retries_timeline = {35};
  run.totals.denied_timeline = {100};
  const Verdict v = Judge(run);
  // The ideal bucket: 20 initial (the capacity) and 50 of refill over the second, each refilled
  // token taken as it comes by a demand of 135: it would have allowed 70.
  EXPECT_DOUBLE_EQ(v.ideal_allowed, 70);
  EXPECT_DOUBLE_EQ(v.utilisation_vs_ideal, 0.5);
  EXPECT_THAT(FleetReportToJson(run, v), HasSubstr("\"utilisation_vs_ideal\":0.5"));
}

TEST(FleetReportJsonTest, IsOneLineWithTheDocumentedFields) {
  FleetRun run = RunWith(300, 10'000, 4.0);
  run.totals.calls = 50'000;
  run.totals.retries_denied = 7;
  run.faults = FaultCounters{.proxied_requests = 10, .dropped_responses = 2,
                             .duplicated_requests = 3, .replayed_requests = 4};
  run.server = ServerView{.tokens_start = 20, .tokens_end = 0.5};
  const std::string line = FleetReportToJson(run, Judge(run));
  EXPECT_EQ(line.find('\n'), std::string::npos);
  google::protobuf::Struct s = ParseJson(line);
  const auto& f = s.fields();
  for (const char* key :
       {"tenant", "strategy", "workers", "threads", "failure_rate", "duration_seconds",
        "call_latency_ms", "policy", "elapsed_seconds", "calls", "attempts", "successes",
        "failures", "retries_allowed", "retries_denied", "bound", "within_budget", "utilisation",
        "library", "server", "faults"}) {
    EXPECT_TRUE(f.contains(key)) << key << " missing in " << line;
  }
  EXPECT_EQ(f.at("calls").number_value(), 50'000);
  EXPECT_EQ(f.at("retries_allowed").number_value(), 300);
  EXPECT_DOUBLE_EQ(f.at("bound").number_value(), 320);
  EXPECT_TRUE(f.at("within_budget").bool_value());
  const auto& policy = f.at("policy").struct_value().fields();
  EXPECT_EQ(policy.at("capacity").number_value(), 20);
  EXPECT_EQ(policy.at("refill_per_second").number_value(), 50);
  EXPECT_EQ(policy.at("success_credit").number_value(), 0.01);
  EXPECT_EQ(policy.at("initial_tokens").number_value(), 20);
  const auto& faults = f.at("faults").struct_value().fields();
  EXPECT_EQ(faults.at("dropped_responses").number_value(), 2);
  EXPECT_EQ(faults.at("duplicated_requests").number_value(), 3);
  EXPECT_EQ(faults.at("replayed_requests").number_value(), 4);
}

TEST(FleetReportJsonTest, HasNoFaultsObjectWithoutFaultInjection) {
  FleetRun run = RunWith(1, 1, 1);
  EXPECT_THAT(FleetReportToJson(run, Judge(run)), ::testing::Not(HasSubstr("faults")));
}

TEST(FleetReportJsonTest, ClusterStopsAndRestartsWithTheirMaxima) {
  FleetRun run = RunWith(1, 1, 1);
  run.cluster = ClusterView{
      .servers = 3,
      .etcd_nodes = 3,
      .stops = {{.at = 5, .server = 1, .seconds = 0.12, .exit = "exit code 0"},
                {.at = 9, .server = 2, .seconds = 1.05, .exit = "exit code 0"}},
      .restarts = {{.at = 6, .server = 1, .serving_after = 0.3},
                   {.at = 10, .server = 2, .serving_after = 5.9},
                   {.at = 12, .server = 0, .error = "exited before serving"}}};
  google::protobuf::Struct s = ParseJson(FleetReportToJson(run, Judge(run)));
  const auto& cluster = s.fields().at("cluster").struct_value().fields();
  EXPECT_DOUBLE_EQ(cluster.at("max_stop_seconds").number_value(), 1.05);
  EXPECT_DOUBLE_EQ(cluster.at("max_restart_to_serving_seconds").number_value(), 5.9);
  EXPECT_EQ(cluster.at("restarts_not_serving").number_value(), 1);
  const auto& stops = cluster.at("stops").list_value().values();
  ASSERT_EQ(stops.size(), 2);
  EXPECT_EQ(stops[1].struct_value().fields().at("server").number_value(), 2);
  EXPECT_EQ(stops[1].struct_value().fields().at("exit").string_value(), "exit code 0");
  const auto& restarts = cluster.at("restarts").list_value().values();
  ASSERT_EQ(restarts.size(), 3);
  EXPECT_DOUBLE_EQ(
      restarts[0].struct_value().fields().at("serving_after_seconds").number_value(), 0.3);
  EXPECT_FALSE(restarts[2].struct_value().fields().contains("serving_after_seconds"));
  EXPECT_EQ(restarts[2].struct_value().fields().at("error").string_value(),
            "exited before serving");
}

TEST(FleetReportJsonTest, ClusterWithoutStopsOrRestartsHasNoSuchFields) {
  FleetRun run = RunWith(1, 1, 1);
  run.cluster = ClusterView{.servers = 3, .etcd_nodes = 3};
  EXPECT_THAT(FleetReportToJson(run, Judge(run)), ::testing::Not(HasSubstr("stops")));
}

TEST(WorkerCountsJsonTest, RoundTrips) {
  WorkerCounts c{.worker = 3, .calls = 1000, .attempts = 1500, .successes = 700,
                 .failures = 300, .retries_allowed = 500, .retries_denied = 250,
                 .run_seconds = 4.25, .lib_successes = 700, .lib_retries_allowed = 500,
                 .lib_retries_denied = 250, .lib_fallback_allowed = 4, .lib_tokens_received = 510,
                 .lib_tokens_returned = 10, .lib_tokens_held = 0,
                 .shutdown_status = "UNAVAILABLE: \"quoted\"\n"};
  absl::StatusOr<WorkerCounts> back = WorkerCountsFromJson(WorkerCountsToJson(c));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->worker, 3);
  EXPECT_EQ(back->calls, 1000u);
  EXPECT_EQ(back->attempts, 1500u);
  EXPECT_EQ(back->successes, 700u);
  EXPECT_EQ(back->failures, 300u);
  EXPECT_EQ(back->retries_allowed, 500u);
  EXPECT_EQ(back->retries_denied, 250u);
  EXPECT_DOUBLE_EQ(back->run_seconds, 4.25);
  EXPECT_EQ(back->lib_fallback_allowed, 4u);
  EXPECT_EQ(back->lib_tokens_received, 510u);
  EXPECT_EQ(back->lib_tokens_returned, 10u);
  EXPECT_EQ(back->shutdown_status, c.shutdown_status);
}

TEST(WorkerCountsJsonTest, RefusesGarbageAndMissingOrNegativeCounts) {
  EXPECT_FALSE(WorkerCountsFromJson("not json").ok());
  EXPECT_FALSE(WorkerCountsFromJson("").ok());
  std::string line = WorkerCountsToJson(WorkerCounts{.shutdown_status = "OK"});
  std::string missing = line;
  missing.replace(missing.find("\"calls\":0,"), 10, "");
  absl::StatusOr<WorkerCounts> r = WorkerCountsFromJson(missing);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("calls"));
  std::string negative = line;
  negative.replace(negative.find("\"attempts\":0"), 12, "\"attempts\":-1");
  r = WorkerCountsFromJson(negative);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("attempts"));
}

TEST(SumWorkersTest, AddsCountsAndKeepsTheFirstShutdownError) {
  WorkerCounts a{.worker = 0, .calls = 10, .successes = 4, .retries_allowed = 3,
                 .run_seconds = 1.0, .lib_tokens_received = 5, .shutdown_status = "OK"};
  WorkerCounts b{.worker = 1, .calls = 20, .successes = 6, .retries_allowed = 2,
                 .run_seconds = 1.5, .lib_tokens_received = 7,
                 .shutdown_status = "UNAVAILABLE: x"};
  WorkerCounts sum = SumWorkers({a, b});
  EXPECT_EQ(sum.calls, 30u);
  EXPECT_EQ(sum.successes, 10u);
  EXPECT_EQ(sum.retries_allowed, 5u);
  EXPECT_EQ(sum.lib_tokens_received, 12u);
  EXPECT_DOUBLE_EQ(sum.run_seconds, 1.5);
  EXPECT_EQ(sum.shutdown_status, "worker 1: UNAVAILABLE: x");
  EXPECT_EQ(SumWorkers({a, a}).shutdown_status, "OK");
}

}  // namespace
}  // namespace retrybudget::fleet
