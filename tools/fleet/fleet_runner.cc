#include "tools/fleet/fleet_runner.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <memory>
#include <stop_token>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/clock.h"
#include "retrybudget/names.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tools/admin/owner_following_call.h"
#include "tools/fleet/chaos_schedule.h"
#include "tools/fleet/cluster_chaos.h"
#include "tools/fleet/fault_proxy.h"
#include "tools/fleet/foreign_worker.h"
#include "tools/fleet/owner_watch.h"
#include "tools/fleet/server_supervisor.h"
#include "tools/fleet/subprocess.h"
#include "tools/fleet/worker.h"

namespace retrybudget::fleet {
namespace {

constexpr absl::Duration kWorkerStartTimeout = absl::Seconds(30);

absl::Status FromGrpc(const grpc::Status& s, absl::string_view what) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": ", s.error_message()));
}

// One admin call about one tenant, sent to the tenant's owner in cluster mode and waiting out
// a shard without owner (tools/admin/owner_following_call.h) for up to `timeout`.
grpc::Status CallAdmin(v1::BudgetAdminService::StubInterface& admin, absl::Duration timeout,
                       const admin::AdminAttempt& attempt) {
  auto setup = [timeout](grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
    // The server may still be starting: wait for it rather than fail at once.
    context.set_wait_for_ready(true);
  };
  return admin::CallFollowingOwner(admin, admin::InsecureOwnerStubs(), setup, attempt,
                                   {.unavailable_for = timeout})
      .status;
}

absl::StatusOr<v1::BudgetStatus> GetBudget(v1::BudgetAdminService::StubInterface& admin,
                                           const std::string& tenant, absl::Duration timeout) {
  v1::GetBudgetRequest request;
  request.set_tenant(tenant);
  v1::GetBudgetResponse response;
  grpc::Status s = CallAdmin(admin, timeout, [&](admin::AdminStub& stub, grpc::ClientContext& c) {
    return stub.GetBudget(&c, request, &response);
  });
  if (!s.ok()) return FromGrpc(s, absl::StrCat("GetBudget(", tenant, ")"));
  return response.budget();
}

bool AnyPolicyField(const FleetOptions& o) {
  return o.capacity || o.refill_per_second || o.success_credit || o.initial_tokens ||
         o.lease_ttl_ms;
}

// Makes the budget of `tenant` exist with the asked policy.
absl::Status PrepareTenant(const FleetOptions& o, const std::string& tenant,
                           const std::shared_ptr<grpc::Channel>& channel) {
  auto admin = v1::BudgetAdminService::NewStub(channel);
  if (o.reset_budget) {
    v1::DeleteBudgetRequest request;
    request.set_tenant(tenant);
    v1::DeleteBudgetResponse response;
    grpc::Status s =
        CallAdmin(*admin, o.connect_timeout, [&](admin::AdminStub& stub, grpc::ClientContext& c) {
          return stub.DeleteBudget(&c, request, &response);
        });
    if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
      return FromGrpc(s, absl::StrCat("DeleteBudget(", tenant, ")"));
    }
  }
  if (AnyPolicyField(o)) {
    v1::PutPolicyRequest request;
    request.set_tenant(tenant);
    v1::BudgetPolicy* p = request.mutable_policy();
    if (o.capacity) p->set_capacity(*o.capacity);
    if (o.refill_per_second) p->set_refill_per_second(*o.refill_per_second);
    if (o.success_credit) p->set_success_credit(*o.success_credit);
    if (o.initial_tokens) p->set_initial_tokens(*o.initial_tokens);
    if (o.lease_ttl_ms) p->set_lease_ttl_ms(*o.lease_ttl_ms);
    v1::PutPolicyResponse response;
    grpc::Status s =
        CallAdmin(*admin, o.connect_timeout, [&](admin::AdminStub& stub, grpc::ClientContext& c) {
          return stub.PutPolicy(&c, request, &response);
        });
    if (!s.ok()) return FromGrpc(s, absl::StrCat("PutPolicy(", tenant, ")"));
    return absl::OkStatus();
  }
  // Keep the server's policy. A tenant not created yet is created the way a worker would
  // create it (first Sync, default policy): a final Sync that reports nothing and wants nothing.
  absl::StatusOr<v1::BudgetStatus> existing = GetBudget(*admin, tenant, o.connect_timeout);
  if (existing.ok() || existing.status().code() != absl::StatusCode::kNotFound) {
    return existing.status();
  }
  auto budget = v1::RetryBudgetService::NewStub(channel);
  v1::SyncRequest request;
  request.set_instance_id(absl::StrCat("fleet-probe-", getpid()));
  request.set_seq(1);
  request.set_final(true);
  request.add_tenants()->set_tenant(tenant);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       absl::ToChronoMilliseconds(o.connect_timeout));
  context.set_wait_for_ready(true);
  v1::SyncResponse response;
  grpc::Status s = budget->Sync(&context, request, &response);
  if (!s.ok()) return FromGrpc(s, absl::StrCat("Sync creating tenant ", tenant));
  if (response.tenants_size() == 1 && response.tenants(0).has_error() &&
      response.tenants(0).error().code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(response.tenants(0).error().code()),
                        absl::StrCat("tenant ", tenant, ": ",
                                     response.tenants(0).error().message()));
  }
  return absl::OkStatus();
}

std::vector<std::string> WorkerArgv(const FleetOptions& o, int index, const std::string& target) {
  std::vector<std::string> argv = {
      o.worker_binary,
      "--worker",
      absl::StrCat("--worker-index=", index),
      absl::StrCat("--server=", target),
      absl::StrCat("--tenant=", o.tenant),
      absl::StrCat("--tenants=", o.tenants),
      absl::StrCat("--threads=", o.threads),
      absl::StrFormat("--duration=%.17g", o.duration_seconds),
      absl::StrFormat("--failure-rate=%.17g", o.failure_rate),
      absl::StrCat("--call-latency=", absl::FormatDuration(o.call_latency)),
      absl::StrCat("--seed=", o.seed),
      absl::StrCat("--strategy=", RetryStrategyName(o.strategy)),
      absl::StrCat("--max-attempts=", o.call.max_attempts),
      absl::StrCat("--backoff-initial=", absl::FormatDuration(o.call.backoff_initial)),
      absl::StrCat("--backoff-max=", absl::FormatDuration(o.call.backoff_max)),
      absl::StrCat("--monitor-period=", absl::FormatDuration(o.monitor_period)),
      absl::StrCat("--refresh-period=", absl::FormatDuration(o.refresh_period)),
      absl::StrCat("--lease-burst=", o.lease_burst),
      absl::StrCat("--fallback-deny=", o.fallback_deny ? "true" : "false"),
  };
  return argv;
}

uint64_t Delta(uint64_t end, uint64_t start) { return end >= start ? end - start : 0; }

struct LevelStats {
  uint64_t samples = 0;
  double sum = 0;
  double max = 0;
  double mean() const { return samples == 0 ? 0 : sum / static_cast<double>(samples); }
};

// Reads the tenant's level every `period` on its own thread until Stop(). Zero period: off.
class LevelSampler {
 public:
  LevelSampler(v1::BudgetAdminService::StubInterface& admin, const std::string& tenant,
               absl::Duration period) {
    if (period <= absl::ZeroDuration()) return;
    thread_ = std::jthread([this, &admin, tenant, period](std::stop_token stop) {
      absl::Time next = absl::Now();
      while (!stop.stop_requested()) {
        absl::StatusOr<v1::BudgetStatus> status = GetBudget(admin, tenant, period * 10);
        if (status.ok()) {
          stats_.samples++;
          stats_.sum += status->tokens();
          stats_.max = std::max(stats_.max, status->tokens());
        }
        next += period;
        Clock::Real()->SleepUntil(next, stop);
      }
    });
  }
  LevelStats Stop() {
    if (thread_.joinable()) {
      thread_.request_stop();
      thread_.join();
    }
    return stats_;
  }

 private:
  LevelStats stats_;  // written by thread_ only until it is joined
  std::jthread thread_;
};

// The tenant's policy as a --policy file for a spawned server, so that a restarted server (with
// or without a snapshot) applies the same policy. Only the fields given.
v1::PolicyConfig PolicyFileFor(const FleetOptions& o) {
  v1::PolicyConfig config;
  for (int i = 0; i < o.tenants; ++i) {
    v1::TenantPolicy* t = config.add_tenants();
    t->set_tenant(FleetTenantName(o.tenant, o.tenants, i));
    v1::BudgetPolicy* p = t->mutable_policy();
    if (o.capacity) p->set_capacity(*o.capacity);
    if (o.refill_per_second) p->set_refill_per_second(*o.refill_per_second);
    if (o.success_credit) p->set_success_credit(*o.success_credit);
    if (o.initial_tokens) p->set_initial_tokens(*o.initial_tokens);
    if (o.lease_ttl_ms) p->set_lease_ttl_ms(*o.lease_ttl_ms);
  }
  return config;
}

PolicyView PolicyViewOf(const v1::BudgetStatus& status) {
  // The server reports every field; an unset one takes its default from budget.proto.
  const v1::BudgetPolicy& policy = status.policy();
  return {.capacity = policy.has_capacity() ? policy.capacity() : 100,
          .refill_per_second = policy.has_refill_per_second() ? policy.refill_per_second() : 1,
          .success_credit = policy.has_success_credit() ? policy.success_credit() : 0.1,
          .initial_tokens = status.tokens(),
          .lease_ttl_ms = policy.has_lease_ttl_ms() ? policy.lease_ttl_ms() : 5000};
}

// How many lines worker `w` prints: one per tenant its threads use.
size_t LinesOfWorker(const FleetOptions& o, int w) {
  if (w >= o.workers) return 1;  // a foreign worker: one tenant
  std::vector<int> used;
  for (int t = 0; t < o.threads; ++t) {
    used.push_back(FleetTenantOfThread(w, o.threads, t, o.tenants));
  }
  std::sort(used.begin(), used.end());
  return static_cast<size_t>(std::unique(used.begin(), used.end()) - used.begin());
}

// A directory the tool owns for one run (port file, policy file, default data dir), removed
// with everything in it when the run ends.
class OwnedTempDir {
 public:
  static absl::StatusOr<std::unique_ptr<OwnedTempDir>> Create() {
    const char* base = getenv("TMPDIR");
    std::string tmpl = absl::StrCat(base != nullptr && *base ? base : "/tmp",
                                    "/retry-budget-fleet-XXXXXX");
    if (mkdtemp(tmpl.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("mkdtemp(", tmpl, "): ", strerror(errno)));
    }
    return std::unique_ptr<OwnedTempDir>(new OwnedTempDir(tmpl));
  }
  ~OwnedTempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  explicit OwnedTempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

// Starts the server of a --spawn-server run: its temporary directory, policy file, data dir.
absl::StatusOr<std::unique_ptr<ServerSupervisor>> SpawnServer(const FleetOptions& o,
                                                              const OwnedTempDir& dir) {
  ServerSupervisorOptions s;
  s.binary = o.spawn_server;
  s.work_dir = dir.path();
  s.extra_args = o.server_args;
  s.data_dir = o.server_data_dir.empty() ? absl::StrCat(dir.path(), "/data") : o.server_data_dir;
  std::error_code error;
  std::filesystem::create_directories(s.data_dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("--server-data-dir '", s.data_dir, "': ", error.message()));
  }
  if (AnyPolicyField(o)) {
    std::string text;
    google::protobuf::TextFormat::PrintToString(PolicyFileFor(o), &text);
    s.policy_file = absl::StrCat(dir.path(), "/policy.textproto");
    std::ofstream out(s.policy_file);
    out << text;
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write ", s.policy_file));
    }
  }
  return ServerSupervisor::Start(std::move(s));
}

// The foreign workers of the run (foreign_worker.h), reaching the server at `target`.
std::vector<ForeignWorker> PlanForeign(const FleetOptions& o, const std::string& target) {
  return PlanForeignWorkers(
      o.foreign_workers,
      {.target = target,
       .tenant = o.tenant,
       .tenants = o.tenants,
       .cpp_workers = o.workers,
       .threads = o.threads,
       .duration_seconds = o.duration_seconds,
       .failure_rate = o.failure_rate,
       .call_latency = o.call_latency,
       .seed = o.seed,
       .timeline_slice = WorkerTimelineSlice(absl::Seconds(o.duration_seconds))});
}

// Worker `i`'s argv: the tool itself as a worker, or the i-th foreign worker's command.
std::vector<std::string> ArgvOfWorker(const FleetOptions& o, const std::vector<ForeignWorker>& f,
                                      int i, const std::string& target) {
  return i < o.workers ? WorkerArgv(o, i, target) : f[static_cast<size_t>(i - o.workers)].argv;
}

// One line of worker `i`: the tool's own format, or the worker protocol's.
absl::StatusOr<WorkerCounts> ParseWorkerLine(const FleetOptions& o,
                                             const std::vector<ForeignWorker>& f, int i,
                                             absl::string_view line) {
  if (i < o.workers) return WorkerCountsFromJson(line);
  return ParseForeignWorkerLine(f[static_cast<size_t>(i - o.workers)], line,
                                WorkerTimelineSlice(absl::Seconds(o.duration_seconds)));
}

// Calls and retries in the timeline slices wholly inside [from, to), and retries from `to` on.
void CountOutage(const WorkerCounts& totals, double from, double to, ChaosView& view) {
  const double w = totals.timeline_slice_seconds;
  if (w <= 0) return;
  for (size_t i = 0; i < totals.calls_timeline.size(); ++i) {
    const double begin = static_cast<double>(i) * w;
    const double end = begin + w;
    if (begin >= from && end <= to) {
      view.calls_during_outage += totals.calls_timeline[i];
      view.retries_during_outage += totals.retries_timeline[i];
    }
    if (begin >= to) view.retries_after_outage += totals.retries_timeline[i];
  }
}

}  // namespace

absl::Status ValidateFleetOptions(const FleetOptions& o) {
  auto bad = [](absl::string_view flag, auto value, absl::string_view want) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", want, ", got ", value));
  };
  if (o.server.empty()) return absl::InvalidArgumentError("--server: must not be empty");
  if (absl::Status s = ValidateTenantName(o.tenant, "--tenant"); !s.ok()) return s;
  if (o.tenants < 1 || o.tenants > 1000) return bad("--tenants", o.tenants, "must be 1-1000");
  if (absl::Status s = ValidateTenantName(FleetTenantName(o.tenant, o.tenants, o.tenants - 1),
                                          "--tenant with --tenants");
      !s.ok()) {
    return s;
  }
  if (o.workers < 1 || o.workers > 1000) return bad("--workers", o.workers, "must be 1-1000");
  if (o.threads < 1 || o.threads > 1000) return bad("--threads", o.threads, "must be 1-1000");
  if (!(o.duration_seconds > 0 && o.duration_seconds <= 86400)) {
    return bad("--duration", o.duration_seconds, "must be in (0, 86400] seconds");
  }
  if (!(o.failure_rate >= 0 && o.failure_rate <= 1)) {
    return bad("--failure-rate", o.failure_rate, "must be in [0, 1]");
  }
  if (o.call_latency < absl::ZeroDuration() || o.call_latency > absl::Seconds(10)) {
    return bad("--call-latency", absl::FormatDuration(o.call_latency), "must be in [0, 10s]");
  }
  if (o.call.max_attempts < 0) return bad("--max-attempts", o.call.max_attempts, "must be >= 0");
  for (auto [flag, p] : {std::pair<const char*, double>{"--fault-drop-response",
                                                        o.fault_drop_response},
                         {"--fault-duplicate-request", o.fault_duplicate_request},
                         {"--fault-replay-old", o.fault_replay_old}}) {
    if (!(p >= 0 && p <= 1)) return bad(flag, p, "must be a probability in [0, 1]");
  }
  if (o.fault_delay < absl::ZeroDuration() || o.fault_delay > absl::Seconds(60)) {
    return bad("--fault-delay", absl::FormatDuration(o.fault_delay), "must be in [0, 60s]");
  }
  if (o.call.backoff_initial < absl::ZeroDuration() ||
      o.call.backoff_max < o.call.backoff_initial) {
    return bad("--backoff-initial/--backoff-max",
               absl::StrCat(absl::FormatDuration(o.call.backoff_initial), "/",
                            absl::FormatDuration(o.call.backoff_max)),
               "must satisfy 0 <= initial <= max");
  }
  if (absl::Status s = ValidateChaosPlan(o.chaos); !s.ok()) return s;
  if (o.cluster < 0 || o.cluster > 16) return bad("--cluster", o.cluster, "must be 0-16");
  if (o.cluster > 0) {
    if (o.spawn_server.empty()) {
      return absl::InvalidArgumentError("--cluster needs --spawn-server (the server binary)");
    }
    if (o.chaos.any()) {
      return absl::InvalidArgumentError(
          "--kill-server-after/--stop-server-after are for one server; with --cluster use "
          "--cluster-chaos");
    }
    if (o.etcd_nodes < 1 || o.etcd_nodes > 7) {
      return bad("--etcd-nodes", o.etcd_nodes, "must be 1-7");
    }
    if (absl::StatusOr<std::vector<ClusterAction>> plan =
            ParseClusterChaos(o.cluster_chaos, o.cluster, o.etcd_nodes);
        !plan.ok()) {
      return plan.status();
    }
  } else if (!o.cluster_chaos.empty()) {
    return absl::InvalidArgumentError("--cluster-chaos needs --cluster");
  }
  if (o.chaos.any() && o.spawn_server.empty()) {
    return absl::InvalidArgumentError(
        "--kill-server-after/--stop-server-after need --spawn-server (the tool must own the "
        "server to kill it)");
  }
  if (!o.spawn_server.empty() && !o.server_args.empty()) {
    for (const std::string& arg : o.server_args) {
      if (arg.empty()) return absl::InvalidArgumentError("--server-arg: empty argument");
    }
  }
  if (!o.foreign_workers.empty() && (o.strategy != RetryStrategy::kBudget || o.fallback_deny)) {
    return absl::InvalidArgumentError(
        "--foreign-workers: the worker protocol has the budget strategy and the default "
        "fallback only (no --strategy other than budget, no --fallback-deny)");
  }
  if (o.monitor_period <= absl::ZeroDuration()) {
    return bad("--monitor-period", absl::FormatDuration(o.monitor_period), "must be > 0");
  }
  if (o.refresh_period < absl::ZeroDuration()) {
    return bad("--refresh-period", absl::FormatDuration(o.refresh_period), "must be >= 0");
  }
  return absl::OkStatus();
}

absl::StatusOr<FleetRun> RunFleet(const FleetOptions& o) {
  if (absl::Status s = ValidateFleetOptions(o); !s.ok()) return s;

  // --spawn-server: the tool's own server, on a port picked once and kept across restarts.
  // Declared first so that it is destroyed (killed if still running) last.
  std::unique_ptr<OwnedTempDir> server_dir;
  std::unique_ptr<ServerSupervisor> spawned;
  std::unique_ptr<testing::ClusterUnderTest> cluster;
  std::string server = o.server;
  if (o.cluster > 0) {
    std::vector<std::string> flags = o.server_args;
    std::string policy_file;
    if (AnyPolicyField(o)) {
      absl::StatusOr<std::unique_ptr<OwnedTempDir>> dir = OwnedTempDir::Create();
      if (!dir.ok()) return dir.status();
      server_dir = *std::move(dir);
      std::string text;
      google::protobuf::TextFormat::PrintToString(PolicyFileFor(o), &text);
      policy_file = absl::StrCat(server_dir->path(), "/policy.textproto");
      std::ofstream out(policy_file);
      out << text;
      if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", policy_file));
      flags.insert(flags.begin(), absl::StrCat("--policy=", policy_file));
    }
    absl::StatusOr<std::unique_ptr<testing::ClusterUnderTest>> started =
        testing::ClusterUnderTest::Start({.etcd = {.etcd_nodes = o.etcd_nodes,
                                                   .etcd_binary = o.etcd_binary},
                                          .servers = o.cluster,
                                          .server_binary = o.spawn_server,
                                          .server_flags = std::move(flags),
                                          .shards = o.cluster_shards,
                                          .lease_ttl = o.cluster_lease_ttl});
    if (!started.ok()) return started.status();
    cluster = *std::move(started);
    // The run starts on a settled cluster: shards still moving between the servers that just
    // joined would be measured as part of whatever fault the run is about.
    if (absl::Status balanced = cluster->WaitUntilBalanced(absl::Seconds(30)); !balanced.ok()) {
      return balanced;
    }
    server = cluster->target();
  } else if (!o.spawn_server.empty()) {
    absl::StatusOr<std::unique_ptr<OwnedTempDir>> dir = OwnedTempDir::Create();
    if (!dir.ok()) return dir.status();
    server_dir = *std::move(dir);
    absl::StatusOr<std::unique_ptr<ServerSupervisor>> started = SpawnServer(o, *server_dir);
    if (!started.ok()) return started.status();
    spawned = *std::move(started);
    server = spawned->address();
    if (!spawned->persistent()) {
      std::cerr << "retry-budget-fleet: WARNING: " << o.spawn_server
                << " has no --data_dir flag: a restarted server starts from an empty state "
                   "(a kill -9 may then create tokens; chaos.persistent = false)\n";
    }
  }

  auto channel = grpc::CreateChannel(server, grpc::InsecureChannelCredentials());
  std::vector<std::string> tenant_names;
  for (int i = 0; i < o.tenants; ++i) {
    tenant_names.push_back(FleetTenantName(o.tenant, o.tenants, i));
    if (absl::Status s = PrepareTenant(o, tenant_names.back(), channel); !s.ok()) return s;
  }
  auto admin = v1::BudgetAdminService::NewStub(channel);

  // Workers reach the server directly, or through the fault proxy.
  std::unique_ptr<FaultProxy> proxy;
  std::string target = server;
  const bool faults = o.fault_drop_response > 0 || o.fault_duplicate_request > 0 ||
                      o.fault_replay_old > 0 || o.fault_delay > absl::ZeroDuration();
  if (faults) {
    absl::StatusOr<std::unique_ptr<FaultProxy>> started =
        FaultProxy::Start({.upstream = server,
                           .drop_response = o.fault_drop_response,
                           .duplicate_request = o.fault_duplicate_request,
                           .replay_old = o.fault_replay_old,
                           .response_delay = o.fault_delay,
                           .seed = o.seed});
    if (!started.ok()) return started.status();
    proxy = *std::move(started);
    target = proxy->address();
  }

  // Start every worker and wait until each has loaded and parsed its flags: process start-up
  // is outside the measured run. A worker creates its client only after "go", so no token
  // leaves the bucket before the level is read.
  const std::vector<ForeignWorker> foreign = PlanForeign(o, target);
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < o.workers + static_cast<int>(foreign.size()); ++i) {
    absl::StatusOr<std::unique_ptr<Subprocess>> child = Subprocess::Spawn(
        ArgvOfWorker(o, foreign, i, target), {.pipe_stdin = true, .pipe_stdout = true});
    if (!child.ok()) return child.status();
    workers.push_back(*std::move(child));
  }
  const absl::Time ready_deadline = absl::Now() + kWorkerStartTimeout;
  for (size_t i = 0; i < workers.size(); ++i) {
    absl::StatusOr<std::string> line = workers[i]->ReadLine(ready_deadline);
    if (!line.ok() || *line != "ready") {
      std::optional<int> exited = workers[i]->Poll();
      return absl::InternalError(absl::StrCat(
          "worker ", i, " did not start: ",
          line.ok() ? absl::StrCat("unexpected line '", *line, "'") : line.status().ToString(),
          exited ? absl::StrCat(" (", DescribeWaitStatus(*exited), ")") : ""));
    }
  }

  // The run starts at the level read: elapsed is measured from the response, so the bound
  // never counts refill from before the level it starts from. With several tenants, from the
  // first tenant's: the later ones' levels are read later, so their bounds are generous by the
  // refill of those few milliseconds.
  absl::StatusOr<v1::BudgetStatus> start_status =
      GetBudget(*admin, tenant_names[0], o.connect_timeout);
  if (!start_status.ok()) return start_status.status();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<v1::BudgetStatus> start_statuses = {*start_status};
  for (size_t i = 1; i < tenant_names.size(); ++i) {
    absl::StatusOr<v1::BudgetStatus> status =
        GetBudget(*admin, tenant_names[i], o.connect_timeout);
    if (!status.ok()) return status.status();
    start_statuses.push_back(*status);
  }
  for (size_t i = 0; i < workers.size(); ++i) {
    if (absl::Status s = workers[i]->WriteStdin("go\n"); !s.ok()) {
      return absl::InternalError(absl::StrCat("worker ", i, " lost before start: ", s.ToString()));
    }
    workers[i]->CloseStdin();
  }
  // The server faults, timed from the same start.
  std::unique_ptr<ChaosSchedule> chaos;
  if (o.chaos.any()) chaos = std::make_unique<ChaosSchedule>(*spawned, o.chaos, t0);
  std::unique_ptr<ClusterChaos> cluster_chaos;
  if (cluster != nullptr) {
    cluster_chaos = std::make_unique<ClusterChaos>(
        *cluster, *ParseClusterChaos(o.cluster_chaos, o.cluster, o.etcd_nodes), tenant_names[0],
        t0);
  }
  // Who owns each tenant while the fleet runs (for the report's owner_losses).
  std::unique_ptr<OwnerWatch> owner_watch;
  if (cluster != nullptr) {
    std::vector<std::string> addresses;
    for (int i = 0; i < cluster->server_count(); ++i) {
      addresses.push_back(cluster->server(i).address());
    }
    owner_watch = std::make_unique<OwnerWatch>(cluster->etcd_client(), cluster->etcd_prefix(),
                                               std::move(addresses), tenant_names, t0);
  }

  // Diagnostic: the bucket level while the fleet runs (a standing level means tokens the leases
  // do not take; see the "server" object of the report). Never part of the verdict.
  LevelSampler sampler(*admin, tenant_names[0], o.tenants == 1 ? o.sample_level
                                                                : absl::ZeroDuration());

  // Each worker prints one line of counts, then exits.
  const absl::Time end_deadline =
      absl::Now() + absl::Seconds(o.duration_seconds) + o.worker_grace;
  std::vector<WorkerCounts> counts;
  std::vector<std::string> raw_lines;
  for (size_t i = 0; i < workers.size(); ++i) {
    std::vector<absl::StatusOr<std::string>> lines;
    for (size_t k = 0; k < LinesOfWorker(o, static_cast<int>(i)); ++k) {
      lines.push_back(workers[i]->ReadLine(end_deadline));
    }
    absl::StatusOr<int> status = workers[i]->Wait(end_deadline);
    if (!status.ok()) {
      return absl::InternalError(absl::StrCat("worker ", i, " hung: ", status.status().ToString()));
    }
    if (!ExitedWith(*status, 0)) {
      return absl::InternalError(
          absl::StrCat("worker ", i, " failed: ", DescribeWaitStatus(*status)));
    }
    for (const absl::StatusOr<std::string>& line : lines) {
      if (!line.ok()) {
        return absl::InternalError(
            absl::StrCat("worker ", i, " printed no counts: ", line.status().ToString()));
      }
      absl::StatusOr<WorkerCounts> parsed =
          ParseWorkerLine(o, foreign, static_cast<int>(i), *line);
      if (!parsed.ok()) {
        return absl::InternalError(absl::StrCat("worker ", i, ": ", parsed.status().message()));
      }
      if (parsed->tenant_index < 0 || parsed->tenant_index >= o.tenants) {
        return absl::InternalError(
            absl::StrCat("worker ", i, ": tenant_index ", parsed->tenant_index, " out of range"));
      }
      counts.push_back(*parsed);
      raw_lines.push_back(WorkerCountsToJson(*parsed));
    }
  }
  if (!o.worker_lines.empty()) {
    std::ofstream out(o.worker_lines);
    for (const std::string& line : raw_lines) out << line << "\n";
    if (!out.flush()) {
      return absl::InternalError(absl::StrCat("cannot write --worker-lines ", o.worker_lines));
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const LevelStats levels = sampler.Stop();
  // Ends the faults not yet due: a hung server is resumed, a killed one restarted, so that the
  // end of the run can be read.
  std::optional<ChaosView> chaos_view;
  if (chaos != nullptr) chaos_view = chaos->Finish();
  std::vector<std::string> cluster_events;
  std::vector<ServerHit> server_hits;
  std::vector<ServerStop> server_stops;
  std::vector<ServerRestart> server_restarts;
  if (cluster_chaos != nullptr) {
    cluster_events = cluster_chaos->Finish();
    server_hits = cluster_chaos->hits();
    server_stops = cluster_chaos->stops();
    server_restarts = cluster_chaos->restarts();
  }
  std::vector<OwnerSample> owner_samples;
  if (owner_watch != nullptr) owner_samples = owner_watch->Finish();

  FleetRun run;
  run.tenant = o.tenant;
  run.strategy = std::string(RetryStrategyName(o.strategy));
  run.workers = o.workers;
  run.threads = o.threads;
  run.failure_rate = o.failure_rate;
  run.duration_seconds = o.duration_seconds;
  run.call_latency_ms = absl::ToDoubleMilliseconds(o.call_latency);
  run.policy = PolicyViewOf(*start_status);
  run.elapsed_seconds = elapsed;
  run.totals = SumWorkers(counts);
  run.totals.worker = static_cast<int>(workers.size());
  if (!foreign.empty()) run.languages = SumByLanguage(counts, o.workers, foreign);
  std::vector<GrantGapView> grant_gaps(tenant_names.size());
  if (o.tenants > 1) {
    for (int i = 0; i < o.tenants; ++i) {
      std::vector<WorkerCounts> lines;
      for (const WorkerCounts& c : counts) {
        if (c.tenant_index == i) lines.push_back(c);
      }
      run.tenants.push_back({.tenant = tenant_names[i],
                             .policy = PolicyViewOf(start_statuses[i]),
                             .totals = SumWorkers(lines)});
      grant_gaps[i] = {.longest = run.tenants.back().totals.ungranted_gap_max_seconds,
                       .ended_at = run.tenants.back().totals.granted_again_at_seconds};
    }
  } else {
    grant_gaps[0] = {.longest = run.totals.ungranted_gap_max_seconds,
                     .ended_at = run.totals.granted_again_at_seconds};
  }
  run.fault_delay_ms = absl::ToDoubleMilliseconds(o.fault_delay);
  if (cluster != nullptr) {
    run.cluster = ClusterView{.servers = cluster->server_count(),
                              .etcd_nodes = cluster->etcd().etcd_node_count(),
                              .target = cluster->target(),
                              .events = std::move(cluster_events),
                              .owner_losses = OwnerLosses(owner_samples, server_hits,
                                                          grant_gaps),
                              .max_seconds_without_owner_key =
                                  MaxSecondsWithoutOwnerKey(owner_samples, elapsed),
                              .stops = std::move(server_stops),
                              .restarts = std::move(server_restarts)};
  }
  if (chaos_view.has_value()) {
    if (chaos_view->kill_at.has_value()) {
      CountOutage(run.totals, *chaos_view->kill_at, chaos_view->restart_at.value_or(elapsed),
                  *chaos_view);
    } else if (chaos_view->stop_at.has_value()) {
      CountOutage(run.totals, *chaos_view->stop_at, chaos_view->resume_at.value_or(elapsed),
                  *chaos_view);
    }
    run.chaos = chaos_view;
  }

  if (proxy != nullptr) {
    proxy->Shutdown();
    run.faults = proxy->counters();
  }
  // Diagnostic view of the server; a failure here does not void the verdict.
  absl::StatusOr<v1::BudgetStatus> end =
      spawned != nullptr && !spawned->running()
          ? absl::StatusOr<v1::BudgetStatus>(absl::UnavailableError("server down"))
          : GetBudget(*admin, tenant_names[0], o.connect_timeout);
  // With several tenants: the sums over every tenant.
  v1::BudgetStatus start_sum = *start_status;
  for (size_t i = 1; end.ok() && i < tenant_names.size(); ++i) {
    absl::StatusOr<v1::BudgetStatus> more = GetBudget(*admin, tenant_names[i], o.connect_timeout);
    if (!more.ok()) {
      end = more.status();
      break;
    }
    const v1::BudgetStatus& a = start_statuses[i];
    start_sum.set_tokens(start_sum.tokens() + a.tokens());
    start_sum.set_granted_total(start_sum.granted_total() + a.granted_total());
    start_sum.set_returned_total(start_sum.returned_total() + a.returned_total());
    start_sum.set_reclaimed_total(start_sum.reclaimed_total() + a.reclaimed_total());
    start_sum.set_retries_total(start_sum.retries_total() + a.retries_total());
    start_sum.set_retries_denied_total(start_sum.retries_denied_total() +
                                       a.retries_denied_total());
    start_sum.set_successes_total(start_sum.successes_total() + a.successes_total());
    end->set_tokens(end->tokens() + more->tokens());
    end->set_granted_total(end->granted_total() + more->granted_total());
    end->set_returned_total(end->returned_total() + more->returned_total());
    end->set_reclaimed_total(end->reclaimed_total() + more->reclaimed_total());
    end->set_retries_total(end->retries_total() + more->retries_total());
    end->set_retries_denied_total(end->retries_denied_total() + more->retries_denied_total());
    end->set_successes_total(end->successes_total() + more->successes_total());
    end->set_active_instances(end->active_instances() + more->active_instances());
  }
  if (end.ok()) {
    const v1::BudgetStatus& s = start_sum;
    run.server = ServerView{
        .tokens_start = s.tokens(),
        .tokens_end = end->tokens(),
        .granted = Delta(end->granted_total(), s.granted_total()),
        .returned = Delta(end->returned_total(), s.returned_total()),
        .reclaimed = Delta(end->reclaimed_total(), s.reclaimed_total()),
        .retries = Delta(end->retries_total(), s.retries_total()),
        .retries_denied = Delta(end->retries_denied_total(), s.retries_denied_total()),
        .successes = Delta(end->successes_total(), s.successes_total()),
        .active_instances_end = end->active_instances(),
        .level_samples = levels.samples,
        .level_mean = levels.mean(),
        .level_max = levels.max};
  }
  if (spawned != nullptr) {
    if (absl::Status s = spawned->Shutdown(absl::Seconds(10)); !s.ok()) {
      std::cerr << "retry-budget-fleet: spawned server: " << s << "\n";
    }
  }
  return run;
}

}  // namespace retrybudget::fleet
