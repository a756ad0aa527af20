// retry-budget-server: the budget server binary.
//
//   retry-budget-server [--listen=127.0.0.1:50051] [--policy=FILE] [--strict]
//                       [--port_file=PATH] [--max_message_bytes=N] [--shutdown_grace=5s]
//                       [--data_dir=DIR] [--snapshot_interval=10s]
//                       [--max_tenants=N] [--max_instances=N] [--max_tenants_per_request=N]
//                       [--tls_cert=PEM --tls_key=PEM [--tls_client_ca=PEM]]
//                       [--allow_insecure_non_loopback]
//
// Signals: SIGINT/SIGTERM shut down cleanly (in-flight RPCs finish, then the final snapshot);
// SIGHUP re-reads --policy (levels kept; an invalid file is refused and the old policy stays).
//
// Exit codes: 0 after a clean shutdown (SIGINT/SIGTERM; in cluster mode also when etcd did not
// take every shard's final state by the hand-over's deadline: those shards are taken over as
// after a crash), 1 when it cannot serve (address in use, port file or data directory not
// writable, final snapshot failed, a cluster-mode stop not done within --shutdown_grace + 2 s,
// etcd unreachable at start with --exit_if_etcd_unavailable), 2 for bad configuration (flags,
// policy file, TLS files, plaintext on a non-loopback address, another number of shards in
// etcd) and for a damaged data directory (a corrupt or truncated snapshot: the server does not
// start on it).
#include <csignal>
#include <cstdlib>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "retrybudget/clock.h"
#include "server/budget_core.h"
#include "server/bearer_authorizer.h"
#include "server/budget_server.h"
#include "server/cluster_metrics.h"
#include "server/cluster_mode.h"
#include "server/log_rate_limit.h"
#include "server/metrics.h"
#include "server/durable_store.h"
#include "server/policy.h"
#include "server/port_file.h"
#include "server/signals.h"
#include "server/snapshotter.h"
#include "server/transport_security.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "prometheus/exposer.h"
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
ABSL_FLAG(std::string, data_dir, "",
          "directory for the snapshot and the reservation journal (created if missing); state is "
          "restored from it at start. Empty: budgets live in memory only and a restart loses "
          "them (levels start again at initial_tokens)");
ABSL_FLAG(absl::Duration, snapshot_interval, absl::Seconds(10),
          "with --data_dir, how often the whole state is snapshotted (a clean snapshot is also "
          "written at SIGINT/SIGTERM); grants are journaled ahead of use in between");
ABSL_FLAG(int64_t, max_tenants, 10'000,
          "most tenants with a budget; creating one more (first Sync of a new name, PutPolicy) "
          "is refused with RESOURCE_EXHAUSTED");
ABSL_FLAG(int64_t, max_instances, 100'000,
          "most client instances tracked; past it the least recently seen are forgotten (they "
          "are taken as a baseline when they come back: forgetting never credits tokens)");
ABSL_FLAG(int64_t, max_tenants_per_request, 256,
          "most tenant entries in one SyncRequest; more is INVALID_ARGUMENT");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server: serve TLS (needs --tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert (unencrypted)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA certificate(s): require and verify client certificates signed by them "
          "(mutual TLS; needs --tls_cert and --tls_key)");
ABSL_FLAG(bool, allow_insecure_non_loopback, false,
          "allow plaintext (no --tls_cert) on an address other than loopback; without it the "
          "server refuses to start there (exit code 2)");
ABSL_FLAG(std::string, metrics_listen, "127.0.0.1:9464",
          "host:port of the Prometheus endpoint (GET /metrics); port 0 picks a free port (see "
          "--metrics_port_file); empty disables metrics");
ABSL_FLAG(std::string, metrics_port_file, "",
          "once the metrics endpoint serves, write its bound port number to this file");
ABSL_FLAG(int32_t, metrics_max_tenants, 1000,
          "most distinct `tenant` label values in the metrics; budgets past it share "
          "tenant=\"_other\"");
ABSL_FLAG(std::string, etcd_endpoints, "",
          "HOST:PORT,... of etcd members: cluster mode (tenants sharded over every server on the "
          "same etcd; DESIGN.md \"Many servers (etcd)\"). Empty: a single in-memory server");
ABSL_FLAG(std::string, advertise, "",
          "cluster mode: HOST:PORT clients reach this server at (also its server id); empty: "
          "the --listen host with the bound port");
ABSL_FLAG(std::string, etcd_prefix, "/retry-budget", "cluster mode: the deployment's etcd prefix");
ABSL_FLAG(int32_t, shards, 64,
          "cluster mode: number of shards; stored in etcd by the first server, checked by others");
ABSL_FLAG(absl::Duration, etcd_lease_ttl, absl::Seconds(5),
          "cluster mode: TTL of this server's etcd lease (whole seconds): a dead server's shards "
          "move after about this long");
ABSL_FLAG(absl::Duration, etcd_reserve_ahead, absl::Seconds(1),
          "cluster mode: a busy tenant's grant reservations in etcd cover about this long of its "
          "grants (10ms..1m): longer costs fewer etcd writes (one per ~3/4 of it per busy "
          "tenant), shorter loses fewer grants when its owner dies (about this long of them)");
ABSL_FLAG(bool, exit_if_etcd_unavailable, false,
          "cluster mode: exit (code 1) when etcd cannot be reached or has no quorum at start. "
          "Without it the server stays up, NOT_SERVING and refusing Syncs with UNAVAILABLE, "
          "tries etcd again with backoff and serves as soon as it has joined");
ABSL_FLAG(std::string, etcd_ca, "", "cluster mode: PEM CA that signs etcd's certificates (TLS)");
ABSL_FLAG(std::string, etcd_cert, "", "cluster mode: PEM client certificate for etcd (mTLS)");
ABSL_FLAG(std::string, etcd_key, "", "cluster mode: PEM key of --etcd_cert");
ABSL_FLAG(std::string, log_level, "info",
          "least severe log level printed: trace, debug, info, warn, error, critical, off");
ABSL_FLAG(absl::Duration, testonly_sync_response_delay, absl::ZeroDuration(),
          "TESTS ONLY: send each Sync response this much later (holds RPCs in flight)");

namespace retrybudget {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitCannotServe = 1;
constexpr int kExitBadConfig = 2;

// Cluster mode, after SIGINT/SIGTERM and the RPCs' grace: the final states' writes and the
// hand-over end within kHandOverTime whatever etcd does, and the process within kStopMargin.
constexpr absl::Duration kHandOverTime = absl::Seconds(1);
constexpr absl::Duration kStopMargin = absl::Seconds(2);

// Everything the flags decide, checked. A new flag adds a field here and a line in the
// ...ConfigFromFlags() function of its group; Run() consumes the config.
struct ServerConfig {
  ServerOptions server;
  v1::PolicyConfig policy;
  // Where the policy came from, for the start-up log.
  std::string policy_source;
  // --policy (re-read on SIGHUP); empty for the built-in default.
  std::string policy_path;
  // --strict, applied again on every reload.
  bool strict_flag = false;
  std::string port_file;
  absl::Duration shutdown_grace;
  // The limits of the core (policy, clock and store are set by Run()).
  CoreOptions core;
  // Empty: in memory only.
  std::string data_dir;
  absl::Duration snapshot_interval;
  TlsFiles tls;
  // The Prometheus endpoint (server/metrics.h); empty `metrics_listen` disables it.
  std::string metrics_listen;
  std::string metrics_port_file;
  size_t metrics_max_tenants = 1000;
  // Cluster mode when etcd_endpoints is set.
  ClusterFlags cluster;
};

// A positive int64 flag as a size_t; INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<size_t> PositiveFlag(absl::string_view name, int64_t value) {
  if (value <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, "=", value, " must be > 0"));
  }
  return static_cast<size_t>(value);
}

// The cluster-mode flags (--etcd_*, --advertise, --shards, --exit_if_etcd_unavailable); they
// exclude --data_dir, read before.
absl::Status ClusterConfigFromFlags(ServerConfig& config) {
  config.cluster = {.etcd_endpoints = absl::GetFlag(FLAGS_etcd_endpoints),
                    .advertise = absl::GetFlag(FLAGS_advertise),
                    .etcd_prefix = absl::GetFlag(FLAGS_etcd_prefix),
                    .shards = absl::GetFlag(FLAGS_shards),
                    .lease_ttl = absl::GetFlag(FLAGS_etcd_lease_ttl),
                    .etcd_ca = absl::GetFlag(FLAGS_etcd_ca),
                    .etcd_cert = absl::GetFlag(FLAGS_etcd_cert),
                    .etcd_key = absl::GetFlag(FLAGS_etcd_key),
                    .exit_if_etcd_unavailable = absl::GetFlag(FLAGS_exit_if_etcd_unavailable)};
  if (auto s = ValidateClusterFlags(config.cluster); !s.ok()) return s;
  const absl::Duration reserve_ahead = absl::GetFlag(FLAGS_etcd_reserve_ahead);
  if (reserve_ahead < absl::Milliseconds(10) || reserve_ahead > absl::Minutes(1)) {
    return absl::InvalidArgumentError(absl::StrCat("--etcd_reserve_ahead=",
                                                   absl::FormatDuration(reserve_ahead),
                                                   " must be between 10ms and 1m"));
  }
  config.core.cluster_reserve_ahead = reserve_ahead;
  if (config.cluster.enabled() && !config.data_dir.empty()) {
    return absl::InvalidArgumentError(
        "--data_dir and --etcd_endpoints exclude each other: in cluster mode the budgets' state "
        "is kept in etcd");
  }
  return absl::OkStatus();
}

// The gRPC endpoint: --listen, --port_file, --max_message_bytes (and the test-only delay).
absl::Status ListenConfigFromFlags(ServerConfig& config) {
  config.server.listen = absl::GetFlag(FLAGS_listen);
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (config.server.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_message_bytes=", config.server.max_message_bytes, " must be > 0"));
  }
  config.server.service.testonly_sync_response_delay =
      absl::GetFlag(FLAGS_testonly_sync_response_delay);
  return absl::OkStatus();
}

// --policy (loaded and validated now, so a bad file stops the start) and --strict.
absl::Status PolicyConfigFromFlags(ServerConfig& config) {
  config.policy_path = absl::GetFlag(FLAGS_policy);
  if (config.policy_path.empty()) {
    config.policy_source = "built-in default policy";
  } else {
    absl::StatusOr<v1::PolicyConfig> loaded = LoadPolicyFile(config.policy_path);
    if (!loaded.ok()) {
      // LoadPolicyFile's message names the file, the line (text format) and the field.
      return absl::InvalidArgumentError(
          absl::StrCat("--policy: ", loaded.status().message()));
    }
    config.policy = *std::move(loaded);
    config.policy_source = config.policy_path;
  }
  config.strict_flag = absl::GetFlag(FLAGS_strict);
  if (config.strict_flag) config.policy.set_strict(true);
  return absl::OkStatus();
}

// The core's limits: --max_tenants, --max_instances, --max_tenants_per_request.
absl::Status LimitsConfigFromFlags(ServerConfig& config) {
  for (auto [name, value, field] :
       {std::tuple{"max_tenants", absl::GetFlag(FLAGS_max_tenants), &config.core.max_tenants},
        std::tuple{"max_instances", absl::GetFlag(FLAGS_max_instances),
                   &config.core.max_instances},
        std::tuple{"max_tenants_per_request", absl::GetFlag(FLAGS_max_tenants_per_request),
                   &config.core.max_tenants_per_request}}) {
    absl::StatusOr<size_t> v = PositiveFlag(name, value);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  return absl::OkStatus();
}

// --data_dir and --snapshot_interval.
absl::Status DataDirConfigFromFlags(ServerConfig& config) {
  config.data_dir = absl::GetFlag(FLAGS_data_dir);
  config.snapshot_interval = absl::GetFlag(FLAGS_snapshot_interval);
  if (config.snapshot_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--snapshot_interval=", absl::FormatDuration(config.snapshot_interval), " must be > 0"));
  }
  return absl::OkStatus();
}

// --tls_cert, --tls_key, --tls_client_ca (the files are read now), and the refusal of plaintext
// on a network address unless --allow_insecure_non_loopback. Reads config.server.listen.
absl::Status TlsConfigFromFlags(ServerConfig& config) {
  config.tls = {.cert_file = absl::GetFlag(FLAGS_tls_cert),
                .key_file = absl::GetFlag(FLAGS_tls_key),
                .client_ca_file = absl::GetFlag(FLAGS_tls_client_ca)};
  if (config.tls.enabled() || config.tls.mutual()) {
    absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
        LoadTlsCredentials(config.tls);
    if (!credentials.ok()) return credentials.status();
    config.server.credentials = *std::move(credentials);
  } else if (!IsLoopbackHost(ListenHost(config.server.listen)) &&
             !absl::GetFlag(FLAGS_allow_insecure_non_loopback)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--listen=", config.server.listen,
        " is not a loopback address and no --tls_cert/--tls_key is set: refusing to serve "
        "budgets and bearer tokens in plaintext on the network. Set up TLS, or pass "
        "--allow_insecure_non_loopback if the network is trusted"));
  }
  return absl::OkStatus();
}

// --shutdown_grace.
absl::Status ShutdownConfigFromFlags(ServerConfig& config) {
  config.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (config.shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shutdown_grace=", absl::FormatDuration(config.shutdown_grace), " must be >= 0"));
  }
  return absl::OkStatus();
}

// --metrics_listen, --metrics_port_file, --metrics_max_tenants.
absl::Status MetricsConfigFromFlags(ServerConfig& config) {
  config.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  config.metrics_port_file = absl::GetFlag(FLAGS_metrics_port_file);
  const int32_t metrics_max_tenants = absl::GetFlag(FLAGS_metrics_max_tenants);
  if (metrics_max_tenants < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_max_tenants=", metrics_max_tenants, " must be >= 1"));
  }
  config.metrics_max_tenants = static_cast<size_t>(metrics_max_tenants);
  return absl::OkStatus();
}

// Every flag, checked: the first bad one's INVALID_ARGUMENT (naming it and its value).
absl::StatusOr<ServerConfig> ConfigFromFlags() {
  // In this order: the TLS check reads --listen and the cluster check --data_dir; when several
  // flags are wrong, the first in this order is the one reported.
  using ConfigStep = absl::Status (*)(ServerConfig&);
  static constexpr ConfigStep kSteps[] = {
      ListenConfigFromFlags,  PolicyConfigFromFlags,  LimitsConfigFromFlags,
      DataDirConfigFromFlags, TlsConfigFromFlags,     ShutdownConfigFromFlags,
      MetricsConfigFromFlags, ClusterConfigFromFlags,
  };
  ServerConfig config;
  for (ConfigStep step : kSteps) {
    if (absl::Status s = step(config); !s.ok()) return s;
  }
  return config;
}

std::string DescribePolicy(absl::string_view source, const v1::PolicyConfig& policy) {
  const absl::StatusOr<ResolvedPolicy> p = ResolvePolicy(policy.default_policy());
  if (!p.ok()) return std::string(p.status().message());
  return absl::StrCat(source, ": default capacity ", p->capacity, ", refill ",
                      p->refill_per_second, "/s, credit ", p->success_credit, ", lease ",
                      absl::FormatDuration(p->lease_ttl), "; ", policy.tenants_size(),
                      " explicit tenant(s); ", policy.strict() ? "strict" : "not strict");
}

std::string DescribePolicy(const ServerConfig& config) {
  return DescribePolicy(config.policy_source, config.policy);
}

std::string DescribeAuth(BearerAuthorizer& authorizer) {
  if (authorizer.credential_count() == 0) {
    return "no bearer credentials configured: every caller may use and administer every budget";
  }
  return absl::StrCat(authorizer.credential_count(), " bearer credential(s), ",
                      authorizer.admin_count(),
                      " of them admin: every RPC needs `authorization: Bearer <token>`");
}

std::string DescribeTransport(const ServerConfig& config, const BudgetServer& server) {
  if (!server.secure()) {
    return absl::StrCat("INSECURE: no TLS, plaintext on ", server.address());
  }
  if (config.tls.mutual()) {
    return absl::StrCat("mutual TLS: certificate ", config.tls.cert_file,
                        "; client certificates required, verified against ",
                        config.tls.client_ca_file);
  }
  return absl::StrCat("TLS: certificate ", config.tls.cert_file,
                      "; no client certificate requested");
}

// SIGHUP: re-reads --policy and applies it to the budgets (levels kept) and to the credentials.
// Anything invalid is refused as a whole and the old policy and credentials stay.
void ReloadPolicy(const ServerConfig& config, BudgetCore& core, BearerAuthorizer& authorizer) {
  if (config.policy_path.empty()) {
    spdlog::warn("SIGHUP: no --policy file to re-read; the built-in default policy stays");
    return;
  }
  absl::StatusOr<v1::PolicyConfig> loaded = LoadPolicyFile(config.policy_path);
  if (!loaded.ok()) {
    // LoadPolicyFile's message names the file, the line (text format) and the field.
    spdlog::error("SIGHUP: policy reload refused, the old policy stays: {}",
                  std::string(loaded.status().message()));
    return;
  }
  if (config.strict_flag) loaded->set_strict(true);
  // Both validate the whole config before changing anything; the file was validated already,
  // so the second cannot fail after the first succeeded.
  if (absl::Status s = core.ReplacePolicy(*loaded); !s.ok()) {
    spdlog::error("SIGHUP: policy reload refused, the old policy stays: {}: {}",
                  config.policy_path, std::string(s.message()));
    return;
  }
  if (absl::Status s = authorizer.Replace(*loaded); !s.ok()) {
    spdlog::error("SIGHUP: credentials of {} refused, the old credentials stay: {}",
                  config.policy_path, std::string(s.message()));
    return;
  }
  spdlog::info("SIGHUP: policy reloaded from {}", DescribePolicy(config.policy_path, *loaded));
  spdlog::info("auth: {}", DescribeAuth(authorizer));
}

// Joins the cluster (ClusterMode::Join): waits for etcd in the background, or, with
// --exit_if_etcd_unavailable, fails at once when etcd cannot be reached. The exit code when the
// server must stop, nullopt when it goes on.
std::optional<int> JoinCluster(const ServerConfig& config, ClusterMode& cluster, BudgetCore& core,
                               BudgetServer& server) {
  const std::string advertise =
      !config.cluster.advertise.empty() ? config.cluster.advertise : server.address();
  // Another number of shards in etcd than --shards, found after waiting for etcd: nothing is
  // owned or served yet, so the process just ends, as it would have at start.
  auto refused = [](const absl::Status& s) {
    spdlog::error("cannot join the cluster: {}", std::string(s.message()));
    spdlog::default_logger()->flush();
    std::_Exit(kExitBadConfig);
  };
  absl::Status s = cluster.Join(&core, &server, advertise, refused);
  if (s.ok()) {
    if (!config.cluster.exit_if_etcd_unavailable) {
      spdlog::info("cluster mode: joining as {} through etcd {} (health NOT_SERVING until "
                   "joined)", advertise, config.cluster.etcd_endpoints);
    }
    return std::nullopt;
  }
  spdlog::error("cannot join the cluster on etcd {}: {}", config.cluster.etcd_endpoints,
                std::string(s.message()));
  server.Shutdown(absl::ZeroDuration());
  return absl::IsInvalidArgument(s) || absl::IsFailedPrecondition(s) ? kExitBadConfig
                                                                      : kExitCannotServe;
}

// Ends the process `margin` from now (exit code kExitCannotServe) unless destroyed first: the
// cluster-mode stop's bound, should anything but etcd hang (etcd's calls are bounded already).
class StopWatchdog {
 public:
  explicit StopWatchdog(absl::Duration margin)
      : thread_([deadline = absl::Now() + margin](std::stop_token stop) {
          if (!Clock::Real()->SleepUntil(deadline, stop)) return;  // stopped first
          spdlog::error("not stopped within --shutdown_grace + {}: exiting now; the shards not "
                        "handed over are taken over as after a crash",
                        absl::FormatDuration(kStopMargin));
          spdlog::default_logger()->flush();
          std::_Exit(kExitCannotServe);
        }) {}

 private:
  std::jthread thread_;
};

// SIGINT/SIGTERM: in-flight RPCs get --shutdown_grace; then, in cluster mode, the shards'
// final states and the hand-over get kHandOverTime, whatever etcd does (a shard not written by
// then is taken over as after a crash: ClusterRouter::ReleaseTogether); in single-server mode
// the final snapshot is written.
int StopServing(const ServerConfig& config, int signo, BudgetServer& server, ClusterMode* cluster,
                Snapshotter* snapshotter) {
  spdlog::info("{} received: refusing new RPCs, waiting up to {} for in-flight ones",
               signo == SIGINT ? "SIGINT" : "SIGTERM",
               absl::FormatDuration(config.shutdown_grace));
  std::optional<StopWatchdog> watchdog;
  if (cluster != nullptr) watchdog.emplace(config.shutdown_grace + kStopMargin);
  server.Shutdown(config.shutdown_grace);
  if (cluster != nullptr) {
    const bool joined = cluster->ownership() != nullptr;
    cluster->Leave(absl::Now() + kHandOverTime);  // no Sync runs: the states written are final
    spdlog::info(joined ? "cluster mode: shards handed over"
                        : "cluster mode: had not joined the cluster: nothing to hand over");
  }
  // Only now, with no Sync running any more, is the final snapshot exact.
  if (snapshotter != nullptr) {
    if (absl::Status s = snapshotter->Stop(); !s.ok()) {
      spdlog::error("final snapshot to {} failed: {} (the last periodic snapshot and the "
                    "journal remain: the next start recovers as after a crash)",
                    config.data_dir, std::string(s.message()));
      return kExitCannotServe;
    }
    spdlog::info("final snapshot written to {}", config.data_dir);
  }
  spdlog::info("stopped");
  return kExitOk;
}

// What Run() starts, in the order it starts it. Members are destroyed in reverse: the gRPC
// server stops before the metrics endpoint, the endpoint before the metrics and the core they
// read, the core before the cluster mode and the store it writes to.
struct ServerProcess {
  // First: a signal that arrives while starting up is then honoured, not fatal.
  std::unique_ptr<ShutdownSignals> signals;
  std::unique_ptr<BearerAuthorizer> authorizer;
  std::unique_ptr<DurableStore> store;   // with --data_dir
  std::unique_ptr<ClusterMode> cluster;  // with --etcd_endpoints
  std::unique_ptr<BudgetCore> core;
  std::unique_ptr<Snapshotter> snapshotter;  // with --data_dir
  // What the metrics endpoint reads: it holds them by weak pointer only.
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  RpcMetrics* rpc_metrics = nullptr;  // one of `collectables`; null while metrics are off
  std::unique_ptr<prometheus::Exposer> metrics_endpoint;  // null while metrics are off
  std::unique_ptr<BudgetServer> server;
};

// A step of Run()'s start: the exit code when the server must not go on (the step has logged
// why), nullopt when it goes on.
using StartStep = std::optional<int> (*)(const ServerConfig&, ServerProcess&);

std::optional<int> InstallSignals(const ServerConfig&, ServerProcess& p) {
  absl::StatusOr<std::unique_ptr<ShutdownSignals>> signals = ShutdownSignals::Install();
  if (!signals.ok()) {
    spdlog::error("{}", std::string(signals.status().message()));
    return kExitCannotServe;
  }
  p.signals = *std::move(signals);
  return std::nullopt;
}

// The bearer credentials of the policy.
std::optional<int> CreateAuthorizer(const ServerConfig& config, ServerProcess& p) {
  absl::StatusOr<std::unique_ptr<BearerAuthorizer>> authorizer =
      BearerAuthorizer::Create(config.policy, {.log = [](absl::string_view line) {
                                 spdlog::warn("{}", std::string(line));
                               }});
  if (!authorizer.ok()) {
    spdlog::error("invalid credentials ({}): {}", config.policy_source,
                  std::string(authorizer.status().message()));
    return kExitBadConfig;
  }
  p.authorizer = *std::move(authorizer);
  return std::nullopt;
}

// --data_dir: opens (creates) the directory; its state is read by RecoverState().
std::optional<int> OpenDataDir(const ServerConfig& config, ServerProcess& p) {
  if (config.data_dir.empty()) return std::nullopt;
  absl::StatusOr<std::unique_ptr<DurableStore>> opened = DurableStore::Open(config.data_dir);
  if (!opened.ok()) {
    spdlog::error("--data_dir={}: {}", config.data_dir, std::string(opened.status().message()));
    return kExitCannotServe;
  }
  p.store = *std::move(opened);
  return std::nullopt;
}

// --etcd_endpoints: the cluster mode, not joined yet (JoinClusterOnceServing() joins).
std::optional<int> CreateClusterMode(const ServerConfig& config, ServerProcess& p) {
  if (!config.cluster.enabled()) return std::nullopt;
  absl::StatusOr<std::unique_ptr<ClusterMode>> created = ClusterMode::Create(
      config.cluster, [](absl::string_view line) { spdlog::info("{}", std::string(line)); });
  if (!created.ok()) {
    spdlog::error("cluster mode (--etcd_endpoints={}): {}", config.cluster.etcd_endpoints,
                  std::string(created.status().message()));
    return kExitBadConfig;
  }
  p.cluster = *std::move(created);
  return std::nullopt;
}

// The budgets, routed through the cluster mode or kept in the store when there is one.
std::optional<int> CreateCore(const ServerConfig& config, ServerProcess& p) {
  CoreOptions options = config.core;
  options.router = p.cluster != nullptr ? p.cluster->router() : nullptr;
  options.policy = config.policy;
  options.clock = Clock::Real();
  options.store = p.store.get();
  options.log = [](absl::string_view line) { spdlog::info("{}", std::string(line)); };
  absl::StatusOr<std::unique_ptr<BudgetCore>> core = BudgetCore::Create(std::move(options));
  if (!core.ok()) {
    spdlog::error("invalid policy ({}): {}", config.policy_source,
                  std::string(core.status().message()));
    return kExitBadConfig;
  }
  p.core = *std::move(core);
  return std::nullopt;
}

// --data_dir: restores the budgets and starts the periodic snapshots. Before the port opens, so
// that no RPC sees the state half restored.
std::optional<int> RecoverState(const ServerConfig& config, ServerProcess& p) {
  if (p.store == nullptr) {
    if (p.cluster == nullptr) {
      spdlog::warn("no --data_dir: budgets are kept in memory only and a restart loses them");
    }
    return std::nullopt;
  }
  absl::StatusOr<std::unique_ptr<Snapshotter>> started =
      Snapshotter::Start(p.core.get(), p.store.get(), config.snapshot_interval,
                         [](absl::string_view line) { spdlog::warn("{}", std::string(line)); });
  if (!started.ok()) {
    if (absl::IsDataLoss(started.status())) {
      spdlog::error("--data_dir={} is damaged, refusing to start on it: {}. Move the named "
                    "file away to start without its state (budgets restart at their "
                    "initial level).",
                    config.data_dir, std::string(started.status().message()));
      return kExitBadConfig;
    }
    spdlog::error("--data_dir={}: cannot recover or snapshot: {}", config.data_dir,
                  std::string(started.status().message()));
    return kExitCannotServe;
  }
  p.snapshotter = *std::move(started);
  spdlog::info("data dir {}: {} budget(s) recovered; snapshot every {} and at shutdown",
               config.data_dir, p.core->tenant_count(),
               absl::FormatDuration(config.snapshot_interval));
  return std::nullopt;
}

// The Prometheus endpoint (unless --metrics_listen is empty): per-RPC counters through the
// service hook, budgets read from the core at scrape time, etcd latencies in cluster mode.
std::optional<int> StartMetrics(const ServerConfig& config, ServerProcess& p) {
  if (config.metrics_listen.empty()) {
    spdlog::info("metrics disabled (--metrics_listen is empty)");
    return std::nullopt;
  }
  auto rpc_metrics = std::make_shared<RpcMetrics>();
  p.collectables = {rpc_metrics, std::make_shared<BudgetMetrics>(BudgetMetricsOptions{
                                     .core = p.core.get(),
                                     .snapshotter = p.snapshotter.get(),
                                     .max_tenants = config.metrics_max_tenants})};
  if (p.cluster != nullptr) {
    auto cluster_metrics = std::make_shared<ClusterMetrics>(p.cluster.get());
    p.cluster->set_latency_observer([m = cluster_metrics.get()](double s) { m->Observe(s); });
    p.collectables.push_back(std::move(cluster_metrics));
  }
  absl::StatusOr<std::unique_ptr<prometheus::Exposer>> endpoint =
      StartMetricsEndpoint(config.metrics_listen, p.collectables);
  if (!endpoint.ok()) {
    spdlog::error("--metrics_listen: {}", std::string(endpoint.status().message()));
    return absl::IsInvalidArgument(endpoint.status()) ? kExitBadConfig : kExitCannotServe;
  }
  p.metrics_endpoint = *std::move(endpoint);
  const int metrics_port = MetricsEndpointPort(*p.metrics_endpoint);
  spdlog::info("metrics on http://{}:{}/metrics (at most {} tenant label values)",
               config.metrics_listen.substr(0, config.metrics_listen.rfind(':')), metrics_port,
               config.metrics_max_tenants);
  if (!config.metrics_port_file.empty()) {
    if (absl::Status s = WritePortFile(config.metrics_port_file, metrics_port); !s.ok()) {
      spdlog::error("--metrics_port_file: {}", std::string(s.message()));
      return kExitCannotServe;
    }
  }
  p.rpc_metrics = rpc_metrics.get();
  return std::nullopt;
}

// The gRPC services' hooks into what the earlier steps started.
ServiceOptions ServiceOptionsOf(const ServerConfig& config, const ServerProcess& p) {
  ServiceOptions service = config.server.service;
  service.core = p.core.get();
  service.authorizer = p.authorizer.get();
  service.metrics = p.rpc_metrics;
  service.log = [](absl::string_view line) { spdlog::info("{}", std::string(line)); };
  if (p.cluster != nullptr) {
    service.list_shards = [c = p.cluster.get()] { return c->ListShards(); };
    service.put_policy = [c = p.cluster.get()](const v1::PutPolicyRequest& request) {
      return c->PutPolicy(request.tenant(), request.policy(), request.update_mask());
    };
  }
  return service;
}

// Opens the gRPC port, then writes --port_file: a port file names a server that serves.
std::optional<int> StartServing(const ServerConfig& config, ServerProcess& p) {
  ServerOptions options = config.server;
  options.service = ServiceOptionsOf(config, p);
  absl::StatusOr<std::unique_ptr<BudgetServer>> server = BudgetServer::Start(std::move(options));
  if (!server.ok()) {
    spdlog::error("{}", std::string(server.status().message()));
    return absl::IsInvalidArgument(server.status()) ? kExitBadConfig : kExitCannotServe;
  }
  p.server = *std::move(server);
  spdlog::info("listening on {} (gRPC); {}", p.server->address(),
               DescribeTransport(config, *p.server));
  spdlog::info("policy {}", DescribePolicy(config));
  spdlog::info("auth: {}", DescribeAuth(*p.authorizer));
  if (!config.port_file.empty()) {
    if (absl::Status s = WritePortFile(config.port_file, p.server->port()); !s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      p.server->Shutdown(absl::ZeroDuration());
      return kExitCannotServe;
    }
  }
  return std::nullopt;
}

// Cluster mode: joins once the port is open (the advertised address is the bound one).
std::optional<int> JoinClusterOnceServing(const ServerConfig& config, ServerProcess& p) {
  if (p.cluster == nullptr) return std::nullopt;
  return JoinCluster(config, *p.cluster, *p.core, *p.server);
}

// Serves until SIGINT/SIGTERM, reloading the policy on every SIGHUP; then stops.
int ServeUntilStopped(const ServerConfig& config, ServerProcess& p) {
  int signo = 0;
  while ((signo = p.signals->Wait()) == SIGHUP) {
    ReloadPolicy(config, *p.core, *p.authorizer);
  }
  return StopServing(config, signo, *p.server, p.cluster.get(), p.snapshotter.get());
}

int Run(const ServerConfig& config) {
  static constexpr StartStep kStart[] = {
      InstallSignals, CreateAuthorizer, OpenDataDir,  CreateClusterMode,      CreateCore,
      RecoverState,   StartMetrics,     StartServing, JoinClusterOnceServing,
  };
  ServerProcess process;
  for (StartStep step : kStart) {
    if (std::optional<int> exit_code = step(config, process)) return *exit_code;
  }
  return ServeUntilStopped(config, process);
}

// The process's log: stderr at --log_level, protobuf's own lines rate-limited into it. False
// (logged) for an unknown level.
bool SetUpLogging(const std::string& log_level) {
  auto logger = spdlog::stderr_color_mt("retry-budget-server");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %n: %v");
  spdlog::set_default_logger(std::move(logger));
  const spdlog::level::level_enum level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    spdlog::error("--log_level=\"{}\" is not one of trace, debug, info, warn, error, "
                  "critical, off", log_level);
    return false;
  }
  spdlog::set_level(level);
  // Protobuf logs a line for every malformed request it parses; a client must not be able to
  // fill our log with them.
  RouteProtobufLogs(absl::Seconds(10), [](absl::string_view level, absl::string_view line) {
    if (level == "FATAL" || level == "ERROR") {
      spdlog::error("{}", std::string(line));
    } else {
      spdlog::warn("{}", std::string(line));
    }
  });
  return true;
}

}  // namespace
}  // namespace retrybudget

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "retry-budget-server: one retry budget per tenant, leased to a fleet of workers over "
      "gRPC.\nUsage: retry-budget-server [--listen=HOST:PORT] [--policy=FILE] [--strict] "
      "[--port_file=PATH]");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  // Debian's Abseil is built with absl::Mutex deadlock detection on, which sends every lock and
  // unlock inside gRPC through one global cycle graph (a few percent of the server's CPU, and a
  // process-wide lock, in bench/server_load_bench). It is a debugging aid; our own locks are
  // std::shared_mutex and are checked by Clang's thread-safety analysis and TSan instead.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  if (!retrybudget::SetUpLogging(absl::GetFlag(FLAGS_log_level))) {
    return retrybudget::kExitBadConfig;
  }
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
