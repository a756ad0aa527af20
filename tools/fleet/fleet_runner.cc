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
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
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
#include "tools/fleet/start_signal.h"
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
         o.lease_ttl_ms || o.mode || o.retry_ratio || o.min_retries_per_second || o.ttl_ms;
}

// The policy fields given on the command line (only those) into `p`.
void SetPolicyFields(const FleetOptions& o, v1::BudgetPolicy* p) {
  if (o.capacity) p->set_capacity(*o.capacity);
  if (o.refill_per_second) p->set_refill_per_second(*o.refill_per_second);
  if (o.success_credit) p->set_success_credit(*o.success_credit);
  if (o.initial_tokens) p->set_initial_tokens(*o.initial_tokens);
  if (o.lease_ttl_ms) p->set_lease_ttl_ms(*o.lease_ttl_ms);
  if (o.mode) p->set_mode(*o.mode == "shadow" ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
  if (o.retry_ratio) p->set_retry_ratio(*o.retry_ratio);
  if (o.min_retries_per_second) p->set_min_retries_per_second(*o.min_retries_per_second);
  if (o.ttl_ms) p->set_ttl_ms(*o.ttl_ms);
}

// --reset-budget: deletes `tenant`'s budget (there may be none).
absl::Status DeleteTenant(const FleetOptions& o, v1::BudgetAdminService::StubInterface& admin,
                          const std::string& tenant) {
  v1::DeleteBudgetRequest request;
  request.set_tenant(tenant);
  v1::DeleteBudgetResponse response;
  grpc::Status s =
      CallAdmin(admin, o.connect_timeout, [&](admin::AdminStub& stub, grpc::ClientContext& c) {
        return stub.DeleteBudget(&c, request, &response);
      });
  if (!s.ok() && s.error_code() != grpc::StatusCode::NOT_FOUND) {
    return FromGrpc(s, absl::StrCat("DeleteBudget(", tenant, ")"));
  }
  return absl::OkStatus();
}

// Sets `tenant`'s policy to the fields given on the command line.
absl::Status PutTenantPolicy(const FleetOptions& o, v1::BudgetAdminService::StubInterface& admin,
                             const std::string& tenant) {
  v1::PutPolicyRequest request;
  request.set_tenant(tenant);
  SetPolicyFields(o, request.mutable_policy());
  v1::PutPolicyResponse response;
  grpc::Status s =
      CallAdmin(admin, o.connect_timeout, [&](admin::AdminStub& stub, grpc::ClientContext& c) {
        return stub.PutPolicy(&c, request, &response);
      });
  if (!s.ok()) return FromGrpc(s, absl::StrCat("PutPolicy(", tenant, ")"));
  return absl::OkStatus();
}

// Creates `tenant` the way a worker would (first Sync, the server's policy): a final Sync that
// reports nothing and wants nothing.
absl::Status CreateTenantBySync(const FleetOptions& o,
                                const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& tenant) {
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

// Makes the budget of `tenant` exist with the asked policy: deleted first with --reset-budget;
// then given the policy of the command line, or, without one, kept with the server's policy
// (created when missing).
absl::Status PrepareTenant(const FleetOptions& o, const std::string& tenant,
                           const std::shared_ptr<grpc::Channel>& channel) {
  auto admin = v1::BudgetAdminService::NewStub(channel);
  if (o.reset_budget) {
    if (absl::Status s = DeleteTenant(o, *admin, tenant); !s.ok()) return s;
  }
  if (AnyPolicyField(o)) return PutTenantPolicy(o, *admin, tenant);
  absl::StatusOr<v1::BudgetStatus> existing = GetBudget(*admin, tenant, o.connect_timeout);
  if (existing.ok() || existing.status().code() != absl::StatusCode::kNotFound) {
    return existing.status();
  }
  return CreateTenantBySync(o, channel, tenant);
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
      absl::StrCat("--retry-cost=", o.retry_cost),
      absl::StrCat("--call-interval=", absl::FormatDuration(o.call_interval)),
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
    SetPolicyFields(o, t->mutable_policy());
  }
  return config;
}

PolicyView PolicyViewOf(const v1::BudgetStatus& status) {
  // The server reports every field of the policy's shape; an unset one takes its default from
  // budget.proto.
  const v1::BudgetPolicy& policy = status.policy();
  PolicyView view{
      .capacity = policy.has_capacity() ? policy.capacity() : 100,
      .refill_per_second = policy.has_refill_per_second() ? policy.refill_per_second() : 1,
      .success_credit = policy.has_success_credit() ? policy.success_credit() : 0.1,
      .initial_tokens = status.tokens(),
      .lease_ttl_ms = policy.has_lease_ttl_ms() ? policy.lease_ttl_ms() : 5000,
      .mode = policy.mode() == v1::MODE_SHADOW ? "shadow" : "enforce"};
  view.windowed =
      policy.has_retry_ratio() || policy.has_min_retries_per_second() || policy.has_ttl_ms();
  if (view.windowed) {
    view.retry_ratio = policy.has_retry_ratio() ? policy.retry_ratio() : 0.2;
    view.min_retries_per_second =
        policy.has_min_retries_per_second() ? policy.min_retries_per_second() : 10;
    view.ttl_ms = policy.has_ttl_ms() ? policy.ttl_ms() : 10000;
    // The bucket a windowed policy resolves to (server/policy.h), for the classic figures the
    // report keeps for reference.
    view.capacity = view.min_retries_per_second * static_cast<double>(view.ttl_ms) / 1000.0;
    view.refill_per_second = view.min_retries_per_second;
    view.success_credit = 0;
    if (!policy.has_lease_ttl_ms()) view.lease_ttl_ms = view.ttl_ms / 10;
  }
  return view;
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

// Writes the tenants' policy (PolicyFileFor) to <dir>/policy.textproto; its path.
absl::StatusOr<std::string> WritePolicyFile(const FleetOptions& o, const OwnedTempDir& dir) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(PolicyFileFor(o), &text);
  std::string path = absl::StrCat(dir.path(), "/policy.textproto");
  std::ofstream out(path);
  out << text;
  if (!out.flush()) return absl::InternalError(absl::StrCat("cannot write ", path));
  return path;
}

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
    absl::StatusOr<std::string> policy_file = WritePolicyFile(o, dir);
    if (!policy_file.ok()) return policy_file.status();
    s.policy_file = *std::move(policy_file);
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
       .timeline_slice = WorkerTimelineSlice(absl::Seconds(o.duration_seconds)),
       .retry_cost = o.retry_cost,
       .call_interval = o.call_interval,
       .max_attempts = o.call.max_attempts});
}

// Worker `i`'s argv: the tool itself as a worker, or the i-th foreign worker's command.
std::vector<std::string> ArgvOfWorker(const FleetOptions& o, const std::vector<ForeignWorker>& f,
                                      int i, const std::string& target) {
  return i < o.workers ? WorkerArgv(o, i, target) : f[static_cast<size_t>(i - o.workers)].argv;
}

// One line of worker `i`: the tool's own format, or the worker protocol's (whose timelines must
// count from `origin_micros`, the start signal's).
absl::StatusOr<WorkerCounts> ParseWorkerLine(const FleetOptions& o,
                                             const std::vector<ForeignWorker>& f, int i,
                                             absl::string_view line, int64_t origin_micros) {
  if (i < o.workers) return WorkerCountsFromJson(line);
  return ParseForeignWorkerLine(f[static_cast<size_t>(i - o.workers)], line,
                                WorkerTimelineSlice(absl::Seconds(o.duration_seconds)),
                                origin_micros);
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

// The servers of a run: the tool's own (--spawn-server: one server on a port picked once and
// kept across restarts; --cluster: etcd and N servers), or none (--server). Members are destroyed
// in reverse: the servers are killed (if still running) before their directory is removed.
struct FleetServers {
  std::unique_ptr<OwnedTempDir> dir;  // port file, policy file, default data dir
  std::unique_ptr<ServerSupervisor> spawned;
  std::unique_ptr<testing::ClusterUnderTest> cluster;
  // What the tool reaches: --server, the spawned server's address or the cluster's target.
  std::string address;
};

// --cluster: etcd and o.cluster servers given the tenants' policy file, settled.
absl::Status StartCluster(const FleetOptions& o, FleetServers& servers) {
  std::vector<std::string> flags = o.server_args;
  if (AnyPolicyField(o)) {
    absl::StatusOr<std::unique_ptr<OwnedTempDir>> dir = OwnedTempDir::Create();
    if (!dir.ok()) return dir.status();
    servers.dir = *std::move(dir);
    absl::StatusOr<std::string> policy_file = WritePolicyFile(o, *servers.dir);
    if (!policy_file.ok()) return policy_file.status();
    flags.insert(flags.begin(), absl::StrCat("--policy=", *policy_file));
  }
  absl::StatusOr<std::unique_ptr<testing::ClusterUnderTest>> started =
      testing::ClusterUnderTest::Start(
          {.etcd = {.etcd_nodes = o.etcd_nodes, .etcd_binary = o.etcd_binary},
           .servers = o.cluster,
           .server_binary = o.spawn_server,
           .server_flags = std::move(flags),
           .shards = o.cluster_shards,
           .lease_ttl = o.cluster_lease_ttl});
  if (!started.ok()) return started.status();
  servers.cluster = *std::move(started);
  // The run starts on a settled cluster: shards still moving between the servers that just
  // joined would be measured as part of whatever fault the run is about.
  if (absl::Status balanced = servers.cluster->WaitUntilBalanced(absl::Seconds(30));
      !balanced.ok()) {
    return balanced;
  }
  servers.address = servers.cluster->target();
  return absl::OkStatus();
}

// --spawn-server: the tool's own server, in a directory of the run.
absl::Status StartSpawnedServer(const FleetOptions& o, FleetServers& servers) {
  absl::StatusOr<std::unique_ptr<OwnedTempDir>> dir = OwnedTempDir::Create();
  if (!dir.ok()) return dir.status();
  servers.dir = *std::move(dir);
  absl::StatusOr<std::unique_ptr<ServerSupervisor>> started = SpawnServer(o, *servers.dir);
  if (!started.ok()) return started.status();
  servers.spawned = *std::move(started);
  servers.address = servers.spawned->address();
  if (!servers.spawned->persistent()) {
    std::cerr << "retry-budget-fleet: WARNING: " << o.spawn_server
              << " has no --data_dir flag: a restarted server starts from an empty state "
                 "(a kill -9 may then create tokens; chaos.persistent = false)\n";
  }
  return absl::OkStatus();
}

absl::Status StartServers(const FleetOptions& o, FleetServers& servers) {
  servers.address = o.server;
  if (o.cluster > 0) return StartCluster(o, servers);
  if (!o.spawn_server.empty()) return StartSpawnedServer(o, servers);
  return absl::OkStatus();
}

// The run's tenant names, each made ready on the server (PrepareTenant).
absl::StatusOr<std::vector<std::string>> PrepareTenants(
    const FleetOptions& o, const std::shared_ptr<grpc::Channel>& channel) {
  std::vector<std::string> names;
  for (int i = 0; i < o.tenants; ++i) {
    names.push_back(FleetTenantName(o.tenant, o.tenants, i));
    if (absl::Status s = PrepareTenant(o, names.back(), channel); !s.ok()) return s;
  }
  return names;
}

// The fault proxy in front of `server` when a --fault-* option asks for one; null otherwise.
absl::StatusOr<std::unique_ptr<FaultProxy>> StartFaultProxy(const FleetOptions& o,
                                                            const std::string& server) {
  const bool faults = o.fault_drop_response > 0 || o.fault_duplicate_request > 0 ||
                      o.fault_replay_old > 0 || o.fault_delay > absl::ZeroDuration();
  if (!faults) return nullptr;
  return FaultProxy::Start({.upstream = server,
                            .drop_response = o.fault_drop_response,
                            .duplicate_request = o.fault_duplicate_request,
                            .replay_old = o.fault_replay_old,
                            .response_delay = o.fault_delay,
                            .seed = o.seed});
}

// Starts every worker (the tool's own, then the foreign ones) and waits until each has loaded
// and parsed its flags ("ready"): process start-up is outside the measured run. A worker creates
// its client only after "go", so no token leaves the bucket before the level is read.
absl::StatusOr<std::vector<std::unique_ptr<Subprocess>>> StartWorkers(
    const FleetOptions& o, const std::vector<ForeignWorker>& foreign, const std::string& target) {
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
  return workers;
}

// Where the run starts: each tenant's budget, and the instant tenant 0's answer arrived.
struct RunStart {
  std::vector<v1::BudgetStatus> statuses;  // one per tenant
  std::chrono::steady_clock::time_point t0;
};

// The run starts at the level read: elapsed is measured from the response, so the bound never
// counts refill from before the level it starts from. With several tenants, from the first
// tenant's: the later ones' levels are read later, so their bounds are generous by the refill of
// those few milliseconds.
absl::StatusOr<RunStart> ReadStartLevels(const FleetOptions& o,
                                         v1::BudgetAdminService::StubInterface& admin,
                                         const std::vector<std::string>& tenants) {
  RunStart start;
  for (size_t i = 0; i < tenants.size(); ++i) {
    absl::StatusOr<v1::BudgetStatus> status = GetBudget(admin, tenants[i], o.connect_timeout);
    if (!status.ok()) return status.status();
    if (i == 0) start.t0 = std::chrono::steady_clock::now();
    start.statuses.push_back(*std::move(status));
  }
  return start;
}

// Tells every worker to start: "go <origin_micros>" (start_signal.h: every worker counts its
// timelines from the run's start, whenever it begins calling), then the end of its stdin.
absl::Status SendGo(std::vector<std::unique_ptr<Subprocess>>& workers, int64_t origin_micros) {
  const std::string go = absl::StrCat(StartSignalLine(origin_micros), "\n");
  for (size_t i = 0; i < workers.size(); ++i) {
    if (absl::Status s = workers[i]->WriteStdin(go); !s.ok()) {
      return absl::InternalError(absl::StrCat("worker ", i, " lost before start: ", s.ToString()));
    }
    workers[i]->CloseStdin();
  }
  return absl::OkStatus();
}

// What runs beside the workers from the start on: the server faults (--chaos) and the cluster
// faults (--cluster-chaos), timed from the run's start; who owns each tenant (cluster runs, for
// the report's owner_losses); the bucket level (a diagnostic: a standing level means tokens the
// leases do not take; see the "server" object of the report; never part of the verdict). They
// use the servers and the admin stub, so they go before them.
struct RunWatchers {
  std::unique_ptr<ChaosSchedule> chaos;
  std::unique_ptr<ClusterChaos> cluster_chaos;
  std::unique_ptr<OwnerWatch> owner_watch;
  std::unique_ptr<LevelSampler> sampler;
  std::unique_ptr<ModeSwitcher> mode_switcher;
};

RunWatchers StartWatchers(const FleetOptions& o, FleetServers& servers,
                          v1::BudgetAdminService::StubInterface& admin,
                          const std::vector<std::string>& tenants,
                          std::chrono::steady_clock::time_point t0) {
  RunWatchers w;
  if (o.chaos.any()) w.chaos = std::make_unique<ChaosSchedule>(*servers.spawned, o.chaos, t0);
  if (servers.cluster != nullptr) {
    testing::ClusterUnderTest& cluster = *servers.cluster;
    w.cluster_chaos = std::make_unique<ClusterChaos>(
        cluster, *ParseClusterChaos(o.cluster_chaos, o.cluster, o.etcd_nodes), tenants[0], t0);
    std::vector<std::string> addresses;
    for (int i = 0; i < cluster.server_count(); ++i) {
      addresses.push_back(cluster.server(i).address());
    }
    w.owner_watch = std::make_unique<OwnerWatch>(cluster.etcd_client(), cluster.etcd_prefix(),
                                                 std::move(addresses), tenants, t0);
  }
  w.sampler = std::make_unique<LevelSampler>(
      admin, tenants[0], o.tenants == 1 ? o.sample_level : absl::ZeroDuration());
  if (!o.mode_switches.empty()) {
    w.mode_switcher = std::make_unique<ModeSwitcher>(
        ModeSwitcherOptions{.budgetctl = o.budgetctl,
                            .server = servers.address,
                            .tenants = tenants,
                            .plan = o.mode_switches},
        t0);
  }
  return w;
}

// What the watchers saw.
struct Watched {
  LevelStats levels;
  std::optional<ChaosView> chaos;
  std::vector<std::string> cluster_events;
  std::vector<ServerHit> server_hits;
  std::vector<ServerStop> server_stops;
  std::vector<ServerRestart> server_restarts;
  std::vector<OwnerSample> owner_samples;
  std::vector<FleetRun::ModeSwitch> mode_switches;
};

// Ends the watchers. The faults not yet due are ended too: a hung server is resumed, a killed one
// restarted, so that the end of the run can be read.
Watched FinishWatchers(RunWatchers& w) {
  Watched seen;
  seen.levels = w.sampler->Stop();
  if (w.chaos != nullptr) seen.chaos = w.chaos->Finish();
  if (w.cluster_chaos != nullptr) {
    seen.cluster_events = w.cluster_chaos->Finish();
    seen.server_hits = w.cluster_chaos->hits();
    seen.server_stops = w.cluster_chaos->stops();
    seen.server_restarts = w.cluster_chaos->restarts();
  }
  if (w.owner_watch != nullptr) seen.owner_samples = w.owner_watch->Finish();
  if (w.mode_switcher != nullptr) seen.mode_switches = w.mode_switcher->Finish();
  return seen;
}

// Worker `i`'s lines of counts (one per tenant its threads use), once it exited with code 0.
absl::StatusOr<std::vector<WorkerCounts>> ReadWorkerCounts(const FleetOptions& o,
                                                           const std::vector<ForeignWorker>& f,
                                                           int i, Subprocess& worker,
                                                           absl::Time deadline,
                                                           int64_t origin_micros) {
  std::vector<absl::StatusOr<std::string>> lines;
  for (size_t k = 0; k < LinesOfWorker(o, i); ++k) lines.push_back(worker.ReadLine(deadline));
  absl::StatusOr<int> status = worker.Wait(deadline);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("worker ", i, " hung: ", status.status().ToString()));
  }
  if (!ExitedWith(*status, 0)) {
    return absl::InternalError(
        absl::StrCat("worker ", i, " failed: ", DescribeWaitStatus(*status)));
  }
  std::vector<WorkerCounts> counts;
  for (const absl::StatusOr<std::string>& line : lines) {
    if (!line.ok()) {
      return absl::InternalError(
          absl::StrCat("worker ", i, " printed no counts: ", line.status().ToString()));
    }
    absl::StatusOr<WorkerCounts> parsed = ParseWorkerLine(o, f, i, *line, origin_micros);
    if (!parsed.ok()) {
      return absl::InternalError(absl::StrCat("worker ", i, ": ", parsed.status().message()));
    }
    if (parsed->tenant_index < 0 || parsed->tenant_index >= o.tenants) {
      return absl::InternalError(
          absl::StrCat("worker ", i, ": tenant_index ", parsed->tenant_index, " out of range"));
    }
    counts.push_back(*std::move(parsed));
  }
  return counts;
}

// Every worker's lines of counts: each prints them at its end, then exits.
absl::StatusOr<std::vector<WorkerCounts>> CollectWorkerCounts(
    const FleetOptions& o, const std::vector<ForeignWorker>& foreign,
    std::vector<std::unique_ptr<Subprocess>>& workers, int64_t origin_micros) {
  const absl::Time end_deadline = absl::Now() + absl::Seconds(o.duration_seconds) + o.worker_grace;
  std::vector<WorkerCounts> counts;
  for (size_t i = 0; i < workers.size(); ++i) {
    absl::StatusOr<std::vector<WorkerCounts>> of_worker =
        ReadWorkerCounts(o, foreign, static_cast<int>(i), *workers[i], end_deadline,
                         origin_micros);
    if (!of_worker.ok()) return of_worker.status();
    counts.insert(counts.end(), of_worker->begin(), of_worker->end());
  }
  return counts;
}

// --worker-lines: every line of counts, one JSON object a line.
absl::Status WriteWorkerLines(const FleetOptions& o, const std::vector<WorkerCounts>& counts) {
  if (o.worker_lines.empty()) return absl::OkStatus();
  std::ofstream out(o.worker_lines);
  for (const WorkerCounts& c : counts) out << WorkerCountsToJson(c) << "\n";
  if (!out.flush()) {
    return absl::InternalError(absl::StrCat("cannot write --worker-lines ", o.worker_lines));
  }
  return absl::OkStatus();
}

// D of the windowed bound: --report-delay-slack, or 2 refresh periods + 1 s + the single
// server's outage.
double ReportDelayOf(const FleetOptions& o) {
  if (o.report_delay_slack > absl::ZeroDuration()) {
    return absl::ToDoubleSeconds(o.report_delay_slack);
  }
  const absl::Duration refresh =
      o.refresh_period > absl::ZeroDuration() ? o.refresh_period : ClientOptions().refresh_period;
  double outage = 0;
  if (o.chaos.kill_after.has_value()) outage = o.chaos.restart_after.value_or(0);
  if (o.chaos.stop_after.has_value()) outage = o.chaos.resume_after.value_or(0);
  return absl::ToDoubleSeconds(2 * refresh) + 1.0 + outage;
}

// The run's settings, its policy as it started and the workers' totals (with each language's
// part when there are foreign workers).
FleetRun FleetRunOf(const FleetOptions& o, const v1::BudgetStatus& start,
                    const std::vector<WorkerCounts>& counts, size_t workers,
                    const std::vector<ForeignWorker>& foreign, double elapsed) {
  FleetRun run;
  run.tenant = o.tenant;
  run.strategy = std::string(RetryStrategyName(o.strategy));
  run.workers = o.workers;
  run.threads = o.threads;
  run.failure_rate = o.failure_rate;
  run.duration_seconds = o.duration_seconds;
  run.call_latency_ms = absl::ToDoubleMilliseconds(o.call_latency);
  run.policy = PolicyViewOf(start);
  run.elapsed_seconds = elapsed;
  run.totals = SumWorkers(counts);
  run.totals.worker = static_cast<int>(workers);
  if (!foreign.empty()) run.languages = SumByLanguage(counts, o.workers, foreign);
  run.fault_delay_ms = absl::ToDoubleMilliseconds(o.fault_delay);
  run.retry_cost = o.retry_cost;
  run.report_delay_seconds = ReportDelayOf(o);
  return run;
}

// With several tenants, each tenant's part of the run; empty with one.
std::vector<TenantRun> TenantRunsOf(const FleetOptions& o, const std::vector<std::string>& tenants,
                                    const RunStart& start,
                                    const std::vector<WorkerCounts>& counts) {
  std::vector<TenantRun> runs;
  if (o.tenants == 1) return runs;
  for (int i = 0; i < o.tenants; ++i) {
    std::vector<WorkerCounts> lines;
    for (const WorkerCounts& c : counts) {
      if (c.tenant_index == i) lines.push_back(c);
    }
    runs.push_back({.tenant = tenants[i],
                    .policy = PolicyViewOf(start.statuses[i]),
                    .totals = SumWorkers(lines)});
  }
  return runs;
}

// Each tenant's longest wait for a grant and when it ended (for the owner losses).
std::vector<GrantGapView> GrantGapsOf(const FleetRun& run) {
  if (run.tenants.empty()) {
    return {{.longest = run.totals.ungranted_gap_max_seconds,
             .ended_at = run.totals.granted_again_at_seconds}};
  }
  std::vector<GrantGapView> gaps;
  for (const TenantRun& t : run.tenants) {
    gaps.push_back({.longest = t.totals.ungranted_gap_max_seconds,
                    .ended_at = t.totals.granted_again_at_seconds});
  }
  return gaps;
}

// The cluster's part of the report: its size, the faults played, the owners lost.
ClusterView ClusterViewOf(testing::ClusterUnderTest& cluster, Watched& seen,
                          const std::vector<GrantGapView>& grant_gaps, double elapsed) {
  return ClusterView{
      .servers = cluster.server_count(),
      .etcd_nodes = cluster.etcd().etcd_node_count(),
      .target = cluster.target(),
      .events = std::move(seen.cluster_events),
      .owner_losses = OwnerLosses(seen.owner_samples, seen.server_hits, grant_gaps),
      .max_seconds_without_owner_key = MaxSecondsWithoutOwnerKey(seen.owner_samples, elapsed),
      .stops = std::move(seen.server_stops),
      .restarts = std::move(seen.server_restarts)};
}

// The single server's fault with the calls and retries of its outage: from the kill to the
// restart, or from the stop to the resume (to the run's end when it did not end).
ChaosView WithOutage(ChaosView view, const WorkerCounts& totals, double elapsed) {
  if (view.kill_at.has_value()) {
    CountOutage(totals, *view.kill_at, view.restart_at.value_or(elapsed), view);
  } else if (view.stop_at.has_value()) {
    CountOutage(totals, *view.stop_at, view.resume_at.value_or(elapsed), view);
  }
  return view;
}

// Adds the budget totals of `add` (level, grants, returns, reclaims, retries, successes,
// instances) to `sum`.
void AddBudgetTotals(v1::BudgetStatus& sum, const v1::BudgetStatus& add) {
  sum.set_tokens(sum.tokens() + add.tokens());
  sum.set_granted_total(sum.granted_total() + add.granted_total());
  sum.set_returned_total(sum.returned_total() + add.returned_total());
  sum.set_reclaimed_total(sum.reclaimed_total() + add.reclaimed_total());
  sum.set_retries_total(sum.retries_total() + add.retries_total());
  sum.set_retries_denied_total(sum.retries_denied_total() + add.retries_denied_total());
  sum.set_successes_total(sum.successes_total() + add.successes_total());
  sum.set_shadow_denied_total(sum.shadow_denied_total() + add.shadow_denied_total());
  sum.set_requests_total(sum.requests_total() + add.requests_total());
  sum.set_retries_allowed_total(sum.retries_allowed_total() + add.retries_allowed_total());
  sum.set_active_instances(sum.active_instances() + add.active_instances());
}

// The server's own view of the run, summed over every tenant: its totals now against those at
// the start, and the levels sampled. Nullopt when a tenant cannot be read (a diagnostic: that
// does not void the verdict).
std::optional<ServerView> ServerViewAtEnd(const FleetOptions& o,
                                          v1::BudgetAdminService::StubInterface& admin,
                                          const std::vector<std::string>& tenants,
                                          const RunStart& start, const LevelStats& levels) {
  v1::BudgetStatus s = start.statuses[0];
  v1::BudgetStatus end;
  for (size_t i = 0; i < tenants.size(); ++i) {
    absl::StatusOr<v1::BudgetStatus> now = GetBudget(admin, tenants[i], o.connect_timeout);
    if (!now.ok()) return std::nullopt;
    if (i == 0) {
      end = *std::move(now);
      continue;
    }
    AddBudgetTotals(s, start.statuses[i]);
    AddBudgetTotals(end, *now);
  }
  return ServerView{.tokens_start = s.tokens(),
                    .tokens_end = end.tokens(),
                    .granted = Delta(end.granted_total(), s.granted_total()),
                    .returned = Delta(end.returned_total(), s.returned_total()),
                    .reclaimed = Delta(end.reclaimed_total(), s.reclaimed_total()),
                    .retries = Delta(end.retries_total(), s.retries_total()),
                    .retries_denied = Delta(end.retries_denied_total(), s.retries_denied_total()),
                    .successes = Delta(end.successes_total(), s.successes_total()),
                    .shadow_denied = Delta(end.shadow_denied_total(), s.shadow_denied_total()),
                    .requests = Delta(end.requests_total(), s.requests_total()),
                    .retries_allowed =
                        Delta(end.retries_allowed_total(), s.retries_allowed_total()),
                    .active_instances_end = end.active_instances(),
                    .level_samples = levels.samples,
                    .level_mean = levels.mean(),
                    .level_max = levels.max};
}

}  // namespace

absl::StatusOr<std::vector<ModeSwitchStep>> ParseModeSwitches(absl::string_view spec) {
  std::vector<ModeSwitchStep> steps;
  if (spec.empty()) return steps;
  for (absl::string_view part : absl::StrSplit(spec, ',')) {
    const size_t at = part.find('@');
    ModeSwitchStep step;
    if (at != absl::string_view::npos) step.mode = std::string(part.substr(0, at));
    if (at == absl::string_view::npos || (step.mode != "enforce" && step.mode != "shadow") ||
        !absl::SimpleAtod(part.substr(at + 1), &step.at_seconds) || !(step.at_seconds >= 0) ||
        (!steps.empty() && step.at_seconds < steps.back().at_seconds)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--mode-switch: bad step '", part,
          "' (expected enforce@SECONDS or shadow@SECONDS, in ascending time)"));
    }
    steps.push_back(std::move(step));
  }
  return steps;
}

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
  if (o.mode && *o.mode != "enforce" && *o.mode != "shadow") {
    return bad("--mode", *o.mode, "must be enforce or shadow");
  }
  if (o.retry_cost < 1 || o.retry_cost > 1000000) {
    return bad("--retry-cost", o.retry_cost, "must be in [1, 1000000]");
  }
  if (o.call_interval < absl::ZeroDuration()) {
    return bad("--call-interval", absl::FormatDuration(o.call_interval), "must be >= 0");
  }
  if (o.report_delay_slack < absl::ZeroDuration()) {
    return bad("--report-delay-slack", absl::FormatDuration(o.report_delay_slack),
               "must be >= 0");
  }
  if (!o.mode_switches.empty() && o.budgetctl.empty()) {
    return absl::InvalidArgumentError("--mode-switch needs --budgetctl (the budgetctl binary)");
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
  // Declared first: destroyed (the servers killed if still running) last.
  FleetServers servers;
  if (absl::Status s = StartServers(o, servers); !s.ok()) return s;
  auto channel = grpc::CreateChannel(servers.address, grpc::InsecureChannelCredentials());
  absl::StatusOr<std::vector<std::string>> tenants = PrepareTenants(o, channel);
  if (!tenants.ok()) return tenants.status();
  auto admin = v1::BudgetAdminService::NewStub(channel);

  absl::StatusOr<std::unique_ptr<FaultProxy>> proxy = StartFaultProxy(o, servers.address);
  if (!proxy.ok()) return proxy.status();
  // Workers reach the server directly, or through the fault proxy.
  const std::string target = *proxy != nullptr ? (*proxy)->address() : servers.address;
  const std::vector<ForeignWorker> foreign = PlanForeign(o, target);
  absl::StatusOr<std::vector<std::unique_ptr<Subprocess>>> workers =
      StartWorkers(o, foreign, target);
  if (!workers.ok()) return workers.status();

  absl::StatusOr<RunStart> start = ReadStartLevels(o, *admin, *tenants);
  if (!start.ok()) return start.status();
  // Every worker's timelines count from t0, the start of the bound's elapsed time.
  const int64_t origin_micros = MonotonicMicros(start->t0);
  if (absl::Status s = SendGo(*workers, origin_micros); !s.ok()) return s;
  RunWatchers watchers = StartWatchers(o, servers, *admin, *tenants, start->t0);
  absl::StatusOr<std::vector<WorkerCounts>> counts =
      CollectWorkerCounts(o, foreign, *workers, origin_micros);
  if (!counts.ok()) return counts.status();
  if (absl::Status s = WriteWorkerLines(o, *counts); !s.ok()) return s;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start->t0).count();
  Watched seen = FinishWatchers(watchers);

  FleetRun run = FleetRunOf(o, start->statuses[0], *counts, workers->size(), foreign, elapsed);
  run.tenants = TenantRunsOf(o, *tenants, *start, *counts);
  run.mode_switches = std::move(seen.mode_switches);
  if (servers.cluster != nullptr) {
    run.cluster = ClusterViewOf(*servers.cluster, seen, GrantGapsOf(run), elapsed);
  }
  if (seen.chaos.has_value()) run.chaos = WithOutage(*seen.chaos, run.totals, elapsed);
  if (*proxy != nullptr) {
    (*proxy)->Shutdown();
    run.faults = (*proxy)->counters();
  }
  if (servers.spawned == nullptr || servers.spawned->running()) {
    run.server = ServerViewAtEnd(o, *admin, *tenants, *start, seen.levels);
  }
  if (servers.spawned != nullptr) {
    if (absl::Status s = servers.spawned->Shutdown(absl::Seconds(10)); !s.ok()) {
      std::cerr << "retry-budget-fleet: spawned server: " << s << "\n";
    }
  }
  return run;
}

}  // namespace retrybudget::fleet
