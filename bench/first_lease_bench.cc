// How long a new client waits for its first lease: the real client library (BudgetClient::Create,
// its refresher thread, a real channel) against the real retry-budget-server binary on loopback.
// For each of N fresh clients (a new channel and connection each, the server already running):
//
//   lease_ms        from Tenant() (which creates the handle and sends its first Sync) to the
//                   lease in force: TenantBudget::WaitReady() returning OK with
//                   Stats().lease_active (a client left without a lease counts as missed)
//   ready_ms        from Tenant() to TenantBudget::WaitReady() returning OK, for a second
//                   tenant of the same client (the connection is up: one Sync round trip)
//   first_retry_ms  another fresh client: from Tenant() to the success of a Retry() whose first
//                   attempt fails at once (so its retry is asked for within microseconds of
//                   Tenant(); backoff 0, the wait for the first answer bounded by 1 s), and
//                   how many of those retries were granted
//   create_ms       BudgetClient::Create() itself (it does not wait for the server)
//
// Every client is the only one alive while it is measured (a new connection each, and gRPC's
// per-process start when none was left), as in a program that starts, calls and exits.
//
// Output: one JSON line per series, then {"bench":"first_lease",...} with the medians, p99s and
// the target (lease_ms median <= 5 ms: about one connection set-up and one Sync). Not a test:
// a missed target is reported, not a failure.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"
#include "tests/support/test_launcher.h"

ABSL_FLAG(int, clients, 200, "fresh clients measured (one after the other)");
ABSL_FLAG(std::string, server_bin, RETRYBUDGET_SERVER_BIN, "the retry-budget-server binary");

namespace retrybudget::bench {
namespace {

constexpr double kTargetMedianMs = 5;
constexpr absl::Duration kGiveUp = absl::Seconds(5);

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "first_lease: %s\n", std::string(s.message()).c_str());
  return 1;
}

std::string Series(const char* name, std::vector<double> values) {
  const double median = Median(values, -1);
  const double p99 = Percentile(values, 99);
  const double max = values.empty() ? -1 : *std::max_element(values.begin(), values.end());
  return absl::StrFormat(
      "{\"bench\":\"first_lease_series\",\"series\":\"%s\",\"n\":%d,\"median_ms\":%.3f,"
      "\"p99_ms\":%.3f,\"max_ms\":%.3f}",
      name, values.size(), median, p99, max);
}

int Main() {
  absl::StatusOr<std::unique_ptr<testing::TempDir>> dir = testing::TempDir::Make();
  if (!dir.ok()) return Fail(dir.status());
  absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> server =
      StartBudgetServer(absl::GetFlag(FLAGS_server_bin), (*dir)->path(), kUnlimitedPolicy);
  if (!server.ok()) return Fail(server.status());

  const int n = std::max(1, absl::GetFlag(FLAGS_clients));
  std::vector<double> lease_ms, ready_ms, create_ms, first_retry_ms;
  int missed = 0;
  int retries_granted = 0;
  for (int i = 0; i < n; ++i) {
    ClientOptions options;
    options.target = (*server)->address();
    // Each client is destroyed before the next is made: gRPC shares a connection among channels
    // of the same target and arguments, and every client measured here must make its own.
    const auto create_start = std::chrono::steady_clock::now();
    absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
    if (!client.ok()) return Fail(client.status());
    create_ms.push_back(MillisSince(create_start));

    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<TenantBudget*> budget = (*client)->Tenant("first-lease");
    if (!budget.ok()) return Fail(budget.status());
    const bool ready = (*budget)->WaitReady(absl::Now() + kGiveUp, {}).ok();
    const double took = MillisSince(start);
    if (ready && (*budget)->Stats().lease_active) {
      lease_ms.push_back(took);
    } else {
      ++missed;
    }

    const auto second = std::chrono::steady_clock::now();
    absl::StatusOr<TenantBudget*> other = (*client)->Tenant("first-lease-2");
    if (!other.ok()) return Fail(other.status());
    if ((*other)->WaitReady(absl::Now() + kGiveUp, {}).ok()) {
      ready_ms.push_back(MillisSince(second));
    }
    client->reset();

    // A fresh client whose first action is a call that fails once.
    absl::StatusOr<std::unique_ptr<BudgetClient>> fresh = BudgetClient::Create(options);
    if (!fresh.ok()) return Fail(fresh.status());
    const auto call_start = std::chrono::steady_clock::now();
    absl::StatusOr<TenantBudget*> first = (*fresh)->Tenant("first-retry");
    if (!first.ok()) return Fail(first.status());
    RetryPolicy policy;
    policy.initial_backoff = absl::Seconds(1);
    policy.max_backoff = absl::Seconds(1);
    const absl::Status result = Retry(
        **first, policy,
        {.deadline = absl::Now() + kGiveUp, .random = [] { return 0.0; }},
        [](const Attempt& a) {
          return a.number == 1 ? absl::UnavailableError("first attempt fails") : absl::OkStatus();
        });
    if (result.ok()) {
      ++retries_granted;
      first_retry_ms.push_back(MillisSince(call_start));
    }
  }

  std::printf("%s\n", Series("lease_ms", lease_ms).c_str());
  std::printf("%s\n", Series("ready_ms", ready_ms).c_str());
  std::printf("%s\n", Series("first_retry_ms", first_retry_ms).c_str());
  std::printf("%s\n", Series("create_ms", create_ms).c_str());
  const double median = Median(lease_ms, -1);
  std::vector<double> sorted = lease_ms;
  const double p99 = Percentile(sorted, 99);
  std::printf(
      "{\"bench\":\"first_lease\",\"clients\":%d,\"leases\":%d,\"missed\":%d,"
      "\"lease_median_ms\":%.3f,\"lease_p99_ms\":%.3f,\"ready_median_ms\":%.3f,"
      "\"first_retries_granted\":%d,\"first_retry_median_ms\":%.3f,"
      "\"targets\":{\"lease_median_ms<=%g\":%s,\"every_first_retry_granted\":%s}}\n",
      n, static_cast<int>(lease_ms.size()), missed, median, p99, Median(ready_ms, -1),
      retries_granted, Median(first_retry_ms, -1), kTargetMedianMs,
      median >= 0 && median <= kTargetMedianMs ? "true" : "false",
      retries_granted == n ? "true" : "false");
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return retrybudget::bench::Main();
}
