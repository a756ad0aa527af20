// The /metrics output of the real server binary (and of the client library's registry):
// promtool accepts it, tenant labels are bounded, and every metric name the Grafana dashboard
// and the alert rules use is one the server or the client actually exposes.
#include <signal.h>

#include <chrono>
#include <fstream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "retrybudget/client.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/ops/ops_test_util.h"

namespace retrybudget::testing {
namespace {

const std::string kSourceDir = RETRYBUDGET_SOURCE_DIR;

std::string Scrape(const OpsServer& server) {
  absl::StatusOr<HttpResponse> r = HttpGet(server.metrics_port, "/metrics");
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok()) return "";
  EXPECT_EQ(r->status, 200);
  return r->body;
}

// Names of the samples in an exposition ("retry_budget_tokens", "..._bucket", ...).
std::set<std::string> SampleNames(const std::string& exposition) {
  std::set<std::string> names;
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    names.insert(std::string(line.substr(0, line.find_first_of("{ "))));
  }
  return names;
}

// The value of the sample written exactly as `series` (e.g. `m{tenant="a"}`), or nullopt.
std::optional<double> SampleValue(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return std::nullopt;
}

std::unique_ptr<v1::BudgetAdminService::Stub> Admin(const OpsServer& server) {
  return v1::BudgetAdminService::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
}

void PutPolicy(v1::BudgetAdminService::Stub& admin, const std::string& tenant, double capacity) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PutPolicyRequest request;
  request.set_tenant(tenant);
  request.mutable_policy()->set_capacity(capacity);
  v1::PutPolicyResponse response;
  const grpc::Status s = admin.PutPolicy(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
}

// A client that leased and spent from `tenant`, with its metrics in `registry`; returns the
// client's exposition once it has its per-tenant series.
std::string ClientExposition(const OpsServer& server, const std::string& tenant) {
  prometheus::Registry registry;
  ClientOptions options;
  options.target = server.address();
  options.metrics_registry = &registry;
  absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (!client.ok()) return "";
  absl::StatusOr<TenantBudget*> budget = (*client)->Tenant(tenant);
  EXPECT_TRUE(budget.ok()) << budget.status();
  if (!budget.ok()) return "";
  std::string text;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  bool spent = false;
  while (absl::Now() < deadline) {
    spent = spent || (*budget)->TryAcquire();
    (*budget)->RecordSuccess();
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, registry.Collect());
    text = out.str();
    if (spent && absl::StrContains(text, "retry_budget_client_mode{") &&
        absl::StrContains(text, "retry_budget_client_retries_allowed_total{")) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(spent) << "the client never got a token";
  EXPECT_TRUE((*client)->Shutdown().ok());
  return text;
}

TEST(MetricsTest, PromtoolAcceptsTheExposition) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY);
  ASSERT_NE(server, nullptr);
  auto admin = Admin(*server);
  PutPolicy(*admin, "promtool", 10);
  const std::string client_text = ClientExposition(*server, "promtool");
  const std::string server_text = Scrape(*server);
  ASSERT_TRUE(absl::StrContains(server_text, "retry_budget_tokens{tenant=\"promtool\"}"))
      << server_text;

  for (const auto& [name, text] : {std::pair{"server", server_text}, {"client", client_text}}) {
    const std::string path = server->dir.path() + "/" + name + ".prom";
    std::ofstream(path) << text;
    const CommandResult r = RunCommand(absl::StrCat(PROMTOOL_BINARY, " check metrics < ", path));
    EXPECT_EQ(r.exit_code, 0) << "promtool check metrics on the " << name << "'s output:\n"
                              << r.output << "\n(is the `prometheus` package installed? "
                              << "scripts/install-deps.sh)";
  }
}

TEST(MetricsTest, ExposesEveryDesignedNameWithTheTenantLabel) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY);
  ASSERT_NE(server, nullptr);
  auto admin = Admin(*server);
  PutPolicy(*admin, "named", 10);
  ClientExposition(*server, "named");  // one Sync at least
  const std::string text = Scrape(*server);
  for (const char* name :
       {"retry_budget_tokens", "retry_budget_leased_tokens", "retry_budget_capacity",
        "retry_budget_active_instances",
        "retry_budget_granted_tokens_total", "retry_budget_wanted_tokens_total",
        "retry_budget_retries_total", "retry_budget_retries_denied_total",
        "retry_budget_successes_total", "retry_budget_returned_tokens_total",
        "retry_budget_reclaimed_tokens_total", "retry_budget_fallback_retries_total",
        "retry_budget_uncredited_tokens_total", "retry_budget_refunded_retries_total",
        "retry_budget_fallback_refunded_retries_total", "retry_budget_shadow",
        "retry_budget_shadow_denied_total", "retry_budget_requests_total",
        "retry_budget_retries_allowed_total", "retry_budget_window_deposits"}) {
    EXPECT_TRUE(SampleValue(text, absl::StrCat(name, "{tenant=\"named\"}")).has_value()) << name;
  }
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"named\"}"), 10);
  EXPECT_EQ(SampleValue(text, "retry_budget_shadow{tenant=\"named\"}"), 0);
  EXPECT_GE(SampleValue(text, "retry_budget_sync_requests_total{code=\"OK\"}").value_or(0), 1);
  EXPECT_GE(SampleValue(text, "retry_budget_sync_duration_seconds_count").value_or(0), 1);
  EXPECT_GE(SampleValue(text, "retry_budget_admin_requests_total{code=\"OK\",rpc=\"PutPolicy\"}")
                .value_or(0),
            1);
  EXPECT_EQ(SampleValue(text, "retry_budget_store_errors_total"), 0);
  EXPECT_TRUE(SampleValue(text, "retry_budget_snapshots_total{result=\"error\"}").has_value());
  EXPECT_EQ(SampleValue(text, "retry_budget_tenants"), 1);
}

TEST(MetricsTest, TheShadowGaugeFollowsTheTenantsMode) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY);
  ASSERT_NE(server, nullptr);
  auto admin = Admin(*server);
  for (const auto& [tenant, mode] : {std::pair{"dry", v1::MODE_SHADOW},
                                     std::pair{"enforced", v1::MODE_ENFORCE}}) {
    grpc::ClientContext context;
    v1::PutPolicyRequest request;
    request.set_tenant(tenant);
    request.mutable_policy()->set_mode(mode);
    v1::PutPolicyResponse response;
    const grpc::Status s = admin->PutPolicy(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  const std::string text = Scrape(*server);
  EXPECT_EQ(SampleValue(text, "retry_budget_shadow{tenant=\"dry\"}"), 1);
  EXPECT_EQ(SampleValue(text, "retry_budget_shadow{tenant=\"enforced\"}"), 0);
  EXPECT_EQ(SampleValue(text, "retry_budget_shadow_denied_total{tenant=\"dry\"}"), 0);
}

TEST(MetricsTest, TenantsPastTheLimitShareTheOtherLabel) {
  std::unique_ptr<OpsServer> server =
      OpsServer::Start(RETRY_BUDGET_SERVER_BINARY, {"--metrics_max_tenants=2"});
  ASSERT_NE(server, nullptr);
  auto admin = Admin(*server);
  PutPolicy(*admin, "a", 10);
  PutPolicy(*admin, "b", 20);
  PutPolicy(*admin, "c", 30);
  PutPolicy(*admin, "d", 40);
  std::string text = Scrape(*server);
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"a\"}"), 10);
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"b\"}"), 20);
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"_other\"}"), 70);
  EXPECT_FALSE(absl::StrContains(text, "tenant=\"c\""));
  EXPECT_FALSE(absl::StrContains(text, "tenant=\"d\""));
  EXPECT_EQ(SampleValue(text, "retry_budget_tenants"), 4);

  // A deleted budget frees its label for the next tenant; the others keep theirs.
  grpc::ClientContext context;
  v1::DeleteBudgetRequest del;
  del.set_tenant("a");
  v1::DeleteBudgetResponse deleted;
  ASSERT_TRUE(admin->DeleteBudget(&context, del, &deleted).ok());
  text = Scrape(*server);
  EXPECT_FALSE(absl::StrContains(text, "tenant=\"a\""));
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"b\"}"), 20);
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"c\"}"), 30);
  EXPECT_EQ(SampleValue(text, "retry_budget_capacity{tenant=\"_other\"}"), 40);
}

TEST(MetricsTest, EmptyMetricsListenDisablesTheEndpoint) {
  // The launcher's default is --metrics_listen= (metrics off).
  absl::StatusOr<std::unique_ptr<ServerUnderTest>> server =
      ServerUnderTest::Start({.binary = RETRY_BUDGET_SERVER_BINARY});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(absl::StrContains((*server)->Log(), "metrics disabled")) << (*server)->Log();
  (*server)->Signal(SIGTERM);
  EXPECT_EQ((*server)->WaitForExit(absl::Seconds(20)), 0);
}

TEST(MetricsTest, DashboardAndAlertsUseOnlyExposedMetrics) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY);
  ASSERT_NE(server, nullptr);
  auto admin = Admin(*server);
  PutPolicy(*admin, "refs", 10);
  std::set<std::string> exposed = SampleNames(ClientExposition(*server, "refs"));
  const std::set<std::string> server_names = SampleNames(Scrape(*server));
  exposed.insert(server_names.begin(), server_names.end());

  const std::string dashboard =
      ReadFileOrDie(kSourceDir + "/deploy/grafana/dashboards/retry-budget.json");
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(dashboard, &parsed).ok())
      << "deploy/grafana/dashboards/retry-budget.json is not valid JSON";
  ASSERT_TRUE(parsed.fields().contains("panels"));
  EXPECT_GE(parsed.fields().at("panels").list_value().values_size(), 6);
  const std::string alerts = ReadFileOrDie(kSourceDir + "/deploy/prometheus/alerts.yml");

  const std::regex metric("retry_budget_[a-zA-Z0-9_]+");
  for (const auto& [file, text] :
       {std::pair{"dashboard", dashboard}, std::pair{"alerts.yml", alerts}}) {
    std::set<std::string> used;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), metric);
         it != std::sregex_iterator(); ++it) {
      used.insert(it->str());
    }
    EXPECT_GE(used.size(), 3u) << file;
    for (const std::string& name : used) {
      EXPECT_TRUE(exposed.contains(name)) << file << " uses " << name
                                          << ", which neither the server nor the client exposes";
    }
  }
  // The dashboard shows what the issues ask for.
  for (const char* name : {"retry_budget_tokens", "retry_budget_granted_tokens_total",
                           "retry_budget_retries_denied_total", "retry_budget_successes_total",
                           "retry_budget_active_instances",
                           "retry_budget_sync_duration_seconds_bucket",
                           "retry_budget_shadow_denied_total", "retry_budget_shadow",
                           "retry_budget_requests_total", "retry_budget_retries_allowed_total"}) {
    EXPECT_TRUE(absl::StrContains(dashboard, name)) << "the dashboard does not show " << name;
  }
}

// Every query of the dashboards is PromQL that Prometheus parses: each, with Grafana's variables
// given values, becomes a recording rule that `promtool check rules` must accept.
TEST(MetricsTest, EveryDashboardQueryParses) {
  ScopedTempDir dir;
  for (const char* file : {"retry-budget.json", "retry-budget-cluster.json"}) {
    const std::string dashboard = ReadFileOrDie(kSourceDir + "/deploy/grafana/dashboards/" + file);
    google::protobuf::Struct parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(dashboard, &parsed).ok()) << file;
    std::string rules = "groups:\n  - name: dashboard\n    rules:\n";
    int queries = 0;
    for (const google::protobuf::Value& panel : parsed.fields().at("panels").list_value().values()) {
      const auto& fields = panel.struct_value().fields();
      if (!fields.contains("targets")) continue;
      for (const google::protobuf::Value& target : fields.at("targets").list_value().values()) {
        std::string expr = target.struct_value().fields().at("expr").string_value();
        expr = absl::StrReplaceAll(expr, {{"$__rate_interval", "1m"}, {"$tenant", ".*"}});
        absl::StrAppend(&rules, "      - record: dashboard:query_", ++queries, "\n",
                        "        expr: '", absl::StrReplaceAll(expr, {{"'", "''"}}), "'\n");
      }
    }
    EXPECT_GE(queries, 3) << file;
    const std::string path = dir.path() + "/" + file + ".rules.yml";
    std::ofstream(path) << rules;
    const CommandResult r = RunCommand(absl::StrCat(PROMTOOL_BINARY, " check rules ", path));
    EXPECT_EQ(r.exit_code, 0) << file << ":\n" << r.output << "\n" << rules;
  }
}

}  // namespace
}  // namespace retrybudget::testing
