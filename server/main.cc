// retry-budget-server: the budget server binary.
//
//   retry-budget-server [--listen=127.0.0.1:50051] [--policy=FILE] [--strict]
//                       [--port_file=PATH] [--max_message_bytes=N] [--shutdown_grace=5s]
//
// Exit codes: 0 after a clean shutdown (SIGINT/SIGTERM), 1 when it cannot serve (address in use,
// port file not writable), 2 for bad configuration (flags, policy file).
#include <csignal>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "server/budget_core.h"
#include "server/budget_server.h"
#include "server/policy.h"
#include "server/port_file.h"
#include "server/signals.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "host:port to serve gRPC on; port 0 picks a free port (see --port_file)");
ABSL_FLAG(std::string, port_file, "",
          "once serving, write the bound port number to this file (atomically: temp file + "
          "rename); for servers started on port 0");
ABSL_FLAG(std::string, policy, "",
          "policy file (text format or JSON of retrybudget.v1.PolicyConfig); without it every "
          "tenant gets the default policy (capacity 100, refill 1/s, credit 0.1, lease 5 s)");
ABSL_FLAG(bool, strict, false,
          "refuse tenants without an explicit policy (NOT_FOUND); turns strict mode on even "
          "when the policy file does not set `strict: true`");
ABSL_FLAG(int32_t, max_message_bytes, retrybudget::kDefaultMaxMessageBytes,
          "largest request accepted, in bytes; larger ones get RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "on SIGINT/SIGTERM, how long in-flight RPCs may take to finish before being cancelled");
ABSL_FLAG(absl::Duration, testonly_sync_response_delay, absl::ZeroDuration(),
          "TESTS ONLY: send each Sync response this much later (holds RPCs in flight)");

namespace retrybudget {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitCannotServe = 1;
constexpr int kExitBadConfig = 2;

// Everything the flags decide, checked. A new flag adds a field here and a line in
// ConfigFromFlags(); Run() consumes the config.
struct ServerConfig {
  ServerOptions server;
  v1::PolicyConfig policy;
  // Where the policy came from, for the start-up log.
  std::string policy_source;
  std::string port_file;
  absl::Duration shutdown_grace;
};

absl::StatusOr<ServerConfig> ConfigFromFlags() {
  ServerConfig config;
  config.server.listen = absl::GetFlag(FLAGS_listen);
  config.server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (config.server.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes=", config.server.max_message_bytes, " must be > 0"));
  }
  config.server.service.testonly_sync_response_delay =
      absl::GetFlag(FLAGS_testonly_sync_response_delay);

  const std::string policy_path = absl::GetFlag(FLAGS_policy);
  if (policy_path.empty()) {
    config.policy_source = "built-in default policy";
  } else {
    absl::StatusOr<v1::PolicyConfig> loaded = LoadPolicyFile(policy_path);
    if (!loaded.ok()) {
      // LoadPolicyFile's message names the file, the line (text format) and the field.
      return absl::InvalidArgumentError(
          absl::StrCat("--policy: ", loaded.status().message()));
    }
    config.policy = *std::move(loaded);
    config.policy_source = policy_path;
  }
  if (absl::GetFlag(FLAGS_strict)) config.policy.set_strict(true);

  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (config.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shutdown_grace=", absl::FormatDuration(config.shutdown_grace), " must be >= 0"));
  }
  return config;
}

std::string DescribePolicy(const ServerConfig& config) {
  const absl::StatusOr<ResolvedPolicy> p = ResolvePolicy(config.policy.default_policy());
  if (!p.ok()) return std::string(p.status().message());
  return absl::StrCat(config.policy_source, ": default capacity ", p->capacity, ", refill ",
                      p->refill_per_second, "/s, credit ", p->success_credit, ", lease ",
                      absl::FormatDuration(p->lease_ttl), "; ", config.policy.tenants_size(),
                      " explicit tenant(s); ", config.policy.strict() ? "strict" : "not strict");
}

int Run(ServerConfig config) {
  // Handlers first: a signal that arrives while starting up is then honoured, not fatal.
  absl::StatusOr<std::unique_ptr<ShutdownSignals>> signals = ShutdownSignals::Install();
  if (!signals.ok()) {
    spdlog::error("{}", std::string(signals.status().message()));
    return kExitCannotServe;
  }

  absl::StatusOr<std::unique_ptr<BudgetCore>> core =
      BudgetCore::Create({.policy = config.policy, .clock = Clock::Real()});
  if (!core.ok()) {
    spdlog::error("invalid policy ({}): {}", config.policy_source, std::string(core.status().message()));
    return kExitBadConfig;
  }
  config.server.service.core = core->get();

  absl::StatusOr<std::unique_ptr<BudgetServer>> server = BudgetServer::Start(config.server);
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return absl::IsInvalidArgument(server.status()) ? kExitBadConfig : kExitCannotServe;
  }
  spdlog::info("listening on {} (gRPC); INSECURE: no TLS, plaintext on {}", (*server)->address(),
               (*server)->address());
  spdlog::info("policy {}", DescribePolicy(config));
  if (!config.port_file.empty()) {
    if (absl::Status s = WritePortFile(config.port_file, (*server)->port()); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      (*server)->Shutdown(absl::ZeroDuration());
      return kExitCannotServe;
    }
  }

  const int signo = (*signals)->Wait();
  spdlog::info("{} received: refusing new RPCs, waiting up to {} for in-flight ones",
               signo == SIGINT ? "SIGINT" : "SIGTERM",
               absl::FormatDuration(config.shutdown_grace));
  (*server)->Shutdown(config.shutdown_grace);
  spdlog::info("stopped");
  return kExitOk;
}

}  // namespace
}  // namespace retrybudget

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "retry-budget-server: one retry budget per tenant, leased to a fleet of workers over "
      "gRPC.\nUsage: retry-budget-server [--listen=HOST:PORT] [--policy=FILE] [--strict] "
      "[--port_file=PATH]");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);

  auto logger = spdlog::stderr_color_mt("retry-budget-server");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n: %v");
  spdlog::set_default_logger(std::move(logger));

  if (positional.size() > 1) {
    spdlog::error("unexpected argument \"{}\" (flags are --name=value)", positional[1]);
    return retrybudget::kExitBadConfig;
  }
  absl::StatusOr<retrybudget::ServerConfig> config = retrybudget::ConfigFromFlags();
  if (!config.ok()) {
    spdlog::error("{}", std::string(config.status().message()));
    return retrybudget::kExitBadConfig;
  }
  return retrybudget::Run(*std::move(config));
}
