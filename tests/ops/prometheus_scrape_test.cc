// A real Prometheus (the Debian `prometheus` binary) scrapes the real server every second while
// the real fleet tool runs 2 workers x 2 threads for 4 s against one tenant. Prometheus's query
// API must then return the tenant's level and counters, equal to what the fleet counted.
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/ops/ops_test_util.h"

namespace retrybudget::testing {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

constexpr char kTenant[] = "ops-scrape";

absl::StatusOr<Struct> ParseJson(const std::string& json) {
  Struct s;
  if (!google::protobuf::util::JsonStringToMessage(json, &s).ok()) {
    return absl::InternalError(absl::StrCat("not JSON: ", json.substr(0, 300)));
  }
  return s;
}

// A running Prometheus scraping 127.0.0.1:`target_port` every second.
class Prometheus {
 public:
  static std::unique_ptr<Prometheus> Start(int target_port) {
    if (!std::ifstream(PROMETHEUS_BINARY).good()) {
      ADD_FAILURE() << PROMETHEUS_BINARY << " not found: install the Debian package "
                    << "`prometheus` (scripts/install-deps.sh)";
      return nullptr;
    }
    auto p = std::unique_ptr<Prometheus>(new Prometheus());
    const std::string config = p->dir_.path() + "/prometheus.yml";
    std::ofstream(config) << "global:\n"
                             "  scrape_interval: 1s\n"
                             "  scrape_timeout: 1s\n"
                             "  evaluation_interval: 1s\n"
                             "scrape_configs:\n"
                             "  - job_name: retry-budget-server\n"
                             "    static_configs:\n"
                             "      - targets: ['127.0.0.1:"
                          << target_port << "']\n";
    for (int attempt = 0; attempt < 3 && !p->process_; ++attempt) {
      p->port_ = FreePort();
      std::optional<ChildProcess> process = ChildProcess::Start(
          PROMETHEUS_BINARY,
          {"--config.file=" + config, "--storage.tsdb.path=" + p->dir_.path() + "/data",
           absl::StrCat("--web.listen-address=127.0.0.1:", p->port_), "--log.level=warn"},
          p->dir_.path() + "/output");
      if (!process) return nullptr;
      // Ready once /-/ready answers 200.
      const absl::Time deadline = absl::Now() + absl::Seconds(30);
      while (absl::Now() < deadline && process->Running()) {
        absl::StatusOr<HttpResponse> r = HttpGet(p->port_, "/-/ready", absl::Seconds(2));
        if (r.ok() && r->status == 200) {
          p->process_ = std::move(process);
          break;
        }
        absl::SleepFor(absl::Milliseconds(100));
      }
      if (!p->process_) ADD_FAILURE() << "prometheus did not start:\n" << process->Output();
    }
    if (!p->process_) return nullptr;
    return p;
  }

  // The instant vector `expr` as (labels JSON, value) pairs.
  absl::StatusOr<std::vector<std::pair<Struct, double>>> Query(const std::string& expr) {
    absl::StatusOr<HttpResponse> r =
        HttpGet(port_, "/api/v1/query?query=" + UrlEncode(expr), absl::Seconds(5));
    if (!r.ok()) return r.status();
    absl::StatusOr<Struct> body = ParseJson(r->body);
    if (!body.ok()) return body.status();
    if (r->status != 200 || body->fields().at("status").string_value() != "success") {
      return absl::InternalError(absl::StrCat("query ", expr, ": HTTP ", r->status, " ", r->body));
    }
    std::vector<std::pair<Struct, double>> samples;
    for (const Value& v :
         body->fields().at("data").struct_value().fields().at("result").list_value().values()) {
      const auto& fields = v.struct_value().fields();
      double value = 0;
      if (!absl::SimpleAtod(fields.at("value").list_value().values(1).string_value(), &value)) {
        return absl::InternalError("malformed sample value");
      }
      samples.emplace_back(fields.at("metric").struct_value(), value);
    }
    return samples;
  }

  // The single value of `expr`, or nullopt when the vector is empty.
  std::optional<double> Scalar(const std::string& expr) {
    absl::StatusOr<std::vector<std::pair<Struct, double>>> r = Query(expr);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->empty()) return std::nullopt;
    EXPECT_EQ(r->size(), 1u) << expr;
    return r->front().second;
  }

  // Polls until `expr` equals `want` (the final scrape may be up to a second away).
  std::optional<double> WaitFor(const std::string& expr, double want, absl::Duration timeout) {
    std::optional<double> got;
    const absl::Time deadline = absl::Now() + timeout;
    do {
      got = Scalar(expr);
      if (got == want) return got;
      absl::SleepFor(absl::Milliseconds(250));
    } while (absl::Now() < deadline);
    return got;
  }

  std::string Output() const { return process_ ? process_->Output() : ""; }

 private:
  Prometheus() = default;
  ScopedTempDir dir_;
  int port_ = 0;
  std::optional<ChildProcess> process_;
};

double Number(const Struct& s, const std::string& field) {
  const auto it = s.fields().find(field);
  EXPECT_NE(it, s.fields().end()) << "no field " << field;
  return it == s.fields().end() ? -1 : it->second.number_value();
}

TEST(PrometheusScrapeTest, QueryApiReturnsTheTenantsLevelAndCountersAsTheFleetCounted) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY);
  ASSERT_NE(server, nullptr);
  std::unique_ptr<Prometheus> prometheus = Prometheus::Start(server->metrics_port);
  ASSERT_NE(prometheus, nullptr);

  // The target is up before the fleet starts, so every second of the run is scraped.
  ASSERT_EQ(prometheus->WaitFor("up{job=\"retry-budget-server\"}", 1, absl::Seconds(20)), 1)
      << prometheus->Output();

  ScopedTempDir fleet_dir;
  std::optional<ChildProcess> fleet = ChildProcess::Start(
      FLEET_BINARY,
      {"--server=" + server->address(), absl::StrCat("--tenant=", kTenant), "--workers=2",
       "--threads=2", "--duration=4", "--failure-rate=0.3", "--capacity=20", "--refill=10",
       "--credit=0.01", "--initial=20"},
      fleet_dir.path() + "/output");
  ASSERT_TRUE(fleet.has_value());

  // During the run: the level is scraped and instances are active.
  const std::string tokens = absl::StrCat("retry_budget_tokens{tenant=\"", kTenant, "\"}");
  std::optional<double> level;
  std::optional<double> active;
  const absl::Time run_deadline = absl::Now() + absl::Seconds(8);
  while (absl::Now() < run_deadline && fleet->Running() && (!level || !active || *active < 1)) {
    level = prometheus->Scalar(tokens);
    active = prometheus->Scalar(
        absl::StrCat("retry_budget_active_instances{tenant=\"", kTenant, "\"}"));
    absl::SleepFor(absl::Milliseconds(250));
  }
  ASSERT_TRUE(level.has_value()) << "no " << tokens << " while the fleet ran";
  EXPECT_GE(*level, 0);
  EXPECT_LE(*level, 20);

  ASSERT_EQ(fleet->Wait(absl::Seconds(60)), 0) << fleet->Output();
  // The fleet's report: the last line of its output that is a JSON object with "tenant".
  std::string report_line;
  for (absl::string_view line : absl::StrSplit(fleet->Output(), '\n')) {
    if (absl::StartsWith(line, "{\"tenant\"")) report_line = std::string(line);
  }
  absl::StatusOr<Struct> report = ParseJson(report_line);
  ASSERT_TRUE(report.ok()) << report.status() << "\n" << fleet->Output();
  ASSERT_EQ(report->fields().at("library").struct_value().fields().at("shutdown_status")
                .string_value(),
            "OK")
      << "a worker's final Sync failed, so the server cannot have every count";
  const double retries = Number(*report, "retries_allowed");
  const double denied = Number(*report, "retries_denied");
  const double successes = Number(*report, "successes");
  ASSERT_GT(retries, 0) << report_line;
  ASSERT_GT(successes, 0) << report_line;

  // After the final scrape, Prometheus holds exactly what the workers counted.
  auto series = [](const char* name) {
    return absl::StrCat(name, "{job=\"retry-budget-server\",tenant=\"", kTenant, "\"}");
  };
  const absl::Duration settle = absl::Seconds(15);
  EXPECT_EQ(prometheus->WaitFor(series("retry_budget_retries_total"), retries, settle), retries);
  EXPECT_EQ(prometheus->WaitFor(series("retry_budget_retries_denied_total"), denied, settle),
            denied);
  EXPECT_EQ(prometheus->WaitFor(series("retry_budget_successes_total"), successes, settle),
            successes);
  // Tokens: every token granted was spent or given back (the fleet shut down cleanly).
  const std::optional<double> granted = prometheus->Scalar(series("retry_budget_granted_tokens_total"));
  const std::optional<double> returned =
      prometheus->Scalar(series("retry_budget_returned_tokens_total"));
  const std::optional<double> reclaimed =
      prometheus->Scalar(series("retry_budget_reclaimed_tokens_total"));
  ASSERT_TRUE(granted && returned && reclaimed);
  EXPECT_EQ(*granted - *returned - *reclaimed, retries);
  EXPECT_EQ(prometheus->Scalar(series("retry_budget_capacity")), 20);
  // The level and the fleet seen during the run.
  EXPECT_TRUE(prometheus->Scalar(series("retry_budget_tokens")).has_value());
  EXPECT_EQ(prometheus->Scalar(absl::StrCat("max_over_time(",
                                            series("retry_budget_active_instances"), "[1m])")),
            2);
  // Server-wide: Syncs counted and timed.
  EXPECT_GT(prometheus->Scalar("retry_budget_sync_requests_total{code=\"OK\"}").value_or(0), 0);
  EXPECT_GT(prometheus->Scalar("retry_budget_sync_duration_seconds_count").value_or(0), 0);
  EXPECT_EQ(prometheus->Scalar("retry_budget_store_errors_total"), 0);
}

}  // namespace
}  // namespace retrybudget::testing
