// Server throughput and latency: Sync/s and p50/p99/p999 of the real retry-budget-server binary,
// next to a bare echo gRPC server built on the same callback API and answering with the same
// request/response sizes, measured in one run by the same load generator. Two more servers
// (load_servers.h) put the same echo service and a real BudgetCore on the async
// completion-queue API, to choose between the two APIs with numbers.
//
// Why: the issue asks for at least 80% of the echo server's throughput: the budget logic, the
// service layer and the accounting should cost little next to gRPC itself.
//
// Method: --rounds rounds; each round runs the four servers back to back (echo_callback,
// retry-budget-server, echo_cq, budget_cq), for 1 and then 8 tenants per request. A ratio is
// taken within each round (the two runs are seconds apart, on the same machine state) and the
// median over the rounds is reported, because this machine is shared and a single run can be
// off by 2x.
//
// The load generator is an async gRPC client (CompletionQueue API): --channels separate
// connections, --in_flight calls outstanding per channel, one CQ thread per --client_threads.
// Payloads are realistic: --instances distinct instance ids (32 hex chars), each with its own
// increasing seq and cumulative counters that stay valid (spent <= received, ...), 1 or 8
// tenants per request from a pool of --tenant_pool tenants, so each tenant is shared by many
// instances as in a real fleet. An instance never has two calls in flight (a real client never
// does). The echo client builds and serializes the very same SyncRequest into its payload, so
// the client's work is the same in both runs; only the server differs.
//
// A fifth server, retry-budget-server-durable, is the same binary with --data_dir (grant
// reservations journaled and fdatasync'ed) and --durable_capacity: a reservation covers a block
// of capacity/8 grants of a tenant, so with the unlimited policy's 1e9 the journal would hardly
// ever be written; 1000 makes it a reservation per ~12 grants of 10 tokens. The ratio
// durable_vs_memory is its Sync/s over the in-memory server's, round by round. A sixth,
// retry-budget-server-metrics, is the in-memory server with its Prometheus endpoint on (as an
// operator runs it; the others run with --metrics_listen= like the tests), not scraped during the
// run: metrics_vs_no_metrics and metrics_cpu_vs_no_metrics are what the per-RPC counters and
// the Sync latency histogram cost. --servers picks a subset (e.g. only two of them).
//
// Besides throughput the bench reads each server's CPU time from /proc, so "server CPU us per
// call" compares the two servers even when the load generator (on the same 2 cores) is the
// bottleneck.
//
// Output: one JSON line per run, then {"bench":"server_load", ...} with the ratios.
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <algorithm>
#include <deque>
#include <map>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "bench/load_servers.h"
#include "bench/echo.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"

ABSL_FLAG(int, channels, 2, "gRPC channels (TCP connections) of the load generator");
ABSL_FLAG(int, in_flight, 32, "calls outstanding per channel");
ABSL_FLAG(int, client_threads, 1, "completion-queue threads of the load generator");
ABSL_FLAG(int, instances, 4096, "distinct client instances the Syncs come from");
ABSL_FLAG(int, tenant_pool, 64, "distinct tenants; each request names 1 or 8 of them");
ABSL_FLAG(absl::Duration, warmup, absl::Seconds(1), "load before measuring, per run");
ABSL_FLAG(absl::Duration, duration, absl::Seconds(4), "measured load, per run");
ABSL_FLAG(int, rounds, 3, "rounds of the servers; ratios are medians over the rounds");
ABSL_FLAG(std::string, server_bin, RETRYBUDGET_SERVER_BIN, "the retry-budget-server binary");
ABSL_FLAG(std::string, serve, "", "internal: serve echo_callback, echo_cq or budget_cq (see "
                                  "load_servers.h), print the port, run until stdin closes");
ABSL_FLAG(double, durable_capacity, 1000,
          "capacity of every tenant of retry-budget-server-durable (refill stays unlimited)");
ABSL_FLAG(std::string, servers,
          "echo_callback,retry-budget-server,retry-budget-server-metrics,"
          "retry-budget-server-durable,echo_cq,budget_cq",
          "the servers each round runs, in this order; ratios need both of their servers");
ABSL_FLAG(std::vector<std::string>, tenants_per_request, std::vector<std::string>({"1", "8"}),
          "tenants named per request, one pass of the rounds each (1..64, at most --tenant_pool)");
ABSL_FLAG(int, cq_threads, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
          "completion-queue threads of the *_cq servers");
ABSL_FLAG(std::string, server_prefix, "",
          "words run before each server's command line, to run it under a profiler (e.g. "
          "\"valgrind --tool=callgrind\"; bench/callgrind_server.sh); it must exec the server in "
          "the same process");
ABSL_FLAG(std::string, at_measure_start, "",
          "shell command run when the measured part of each run starts ({pid}: the server's pid)");
ABSL_FLAG(std::string, at_measure_end, "",
          "shell command run when the measured part of each run ends ({pid}: the server's pid)");

namespace retrybudget::bench {
namespace {

// ---------------------------------------------------------------------------------------------
// Realistic Sync traffic.

// One instance's books for one tenant, kept valid the way a real client keeps them.
struct TenantBooks {
  uint64_t successes = 0, spent = 0, denied = 0, received = 0, held = 0;
};

struct InstanceState {
  std::string id;
  uint64_t seq = 0;
  std::vector<int> tenants;      // indices into the tenant pool
  std::vector<TenantBooks> books;
};

std::string TenantName(int i) { return absl::StrFormat("service-%03d.prod", i); }

std::vector<InstanceState> MakeInstances(int count, int per_request, int pool) {
  std::vector<InstanceState> out(count);
  for (int i = 0; i < count; ++i) {
    out[i].id = absl::StrFormat("%016x%016x", 0x9e3779b97f4a7c15ULL * (i + 1), i * 7919ULL);
    for (int k = 0; k < per_request; ++k) {
      out[i].tenants.push_back((i + k * (pool / per_request)) % pool);
    }
    out[i].books.resize(per_request);
  }
  return out;
}

// Fills `request` for the next Sync of `inst`: some successes and spent retries since the last
// one, cumulative counters, a want of 10.
void NextRequest(InstanceState& inst, const std::vector<std::string>& names,
                 v1::SyncRequest* request) {
  request->Clear();
  request->set_instance_id(inst.id);
  request->set_seq(++inst.seq);
  for (size_t k = 0; k < inst.tenants.size(); ++k) {
    TenantBooks& b = inst.books[k];
    b.successes += 20;
    const uint64_t spend = std::min<uint64_t>(b.held, 3);
    b.spent += spend;
    b.held -= spend;
    b.denied += spend < 3 ? 1 : 0;
    v1::TenantSync* t = request->add_tenants();
    t->set_tenant(names[inst.tenants[k]]);
    t->set_successes(b.successes);
    t->set_retries_spent(b.spent);
    t->set_retries_denied(b.denied);
    t->set_tokens_received(b.received);
    t->set_want(10);
  }
}

void ApplyResponse(InstanceState& inst, const v1::SyncResponse& response) {
  if (response.stale()) return;
  for (int k = 0; k < response.tenants_size() && k < static_cast<int>(inst.books.size()); ++k) {
    inst.books[k].received += response.tenants(k).granted();
    inst.books[k].held += response.tenants(k).granted();
  }
}

// A SyncResponse as the server would answer `request` (for sizing the echo response).
v1::SyncResponse TypicalResponse(const v1::SyncRequest& request) {
  v1::SyncResponse r;
  for (const auto& t : request.tenants()) {
    v1::TenantGrant* g = r.add_tenants();
    g->set_tenant(t.tenant());
    g->set_granted(10);
    g->set_lease_ttl_ms(5000);
    g->set_next_sync_ms(1000);
    g->mutable_safe_share()->set_capacity(1e9 / 64);
    g->mutable_safe_share()->set_refill_per_second(1e9 / 64);
    g->set_bucket_tokens(999999987.5);
    g->set_capacity(1e9);
    g->set_active_instances(64);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// The load generator.

enum class Target { kBudget, kEcho };

struct RunResult {
  std::string server;
  int round = 0;
  int tenants_per_request = 0;
  uint64_t calls = 0;
  uint64_t errors = 0;
  uint64_t stale = 0;
  double seconds = 0;
  double per_second = 0;
  double p50_us = 0, p99_us = 0, p999_us = 0;
  double server_cpu_us_per_call = 0;
  size_t request_bytes = 0, response_bytes = 0;
};

struct Call {
  grpc::ClientContext context;
  int instance = -1;
  absl::Time start;
  grpc::Status status;
  v1::SyncRequest sync_request;
  v1::SyncResponse sync_response;
  bench::EchoRequest echo_request;
  bench::EchoResponse echo_response;
  std::unique_ptr<grpc::ClientAsyncResponseReader<v1::SyncResponse>> sync_reader;
  std::unique_ptr<grpc::ClientAsyncResponseReader<bench::EchoResponse>> echo_reader;
  int channel = 0;
};

struct ThreadTotals {
  uint64_t calls = 0, errors = 0, stale = 0;
  std::vector<double> latencies_us;
};

// One CQ thread: keeps in_flight calls outstanding on each of its channels until `stop_at`,
// records completions between `measure_from` and `stop_at`.
class LoadThread {
 public:
  LoadThread(Target target, std::vector<std::shared_ptr<grpc::Channel>> channels, int in_flight,
             std::vector<InstanceState> instances, const std::vector<std::string>* names,
             uint32_t echo_response_bytes)
      : target_(target),
        channels_(std::move(channels)),
        in_flight_(in_flight),
        instances_(std::move(instances)),
        names_(names),
        echo_response_bytes_(echo_response_bytes) {
    for (auto& ch : channels_) {
      sync_stubs_.push_back(v1::RetryBudgetService::NewStub(ch));
      echo_stubs_.push_back(EchoService::NewStub(ch));
    }
    for (size_t i = 0; i < instances_.size(); ++i) idle_.push_back(static_cast<int>(i));
    totals_.latencies_us.reserve(1 << 20);
  }

  void Run(absl::Time measure_from, absl::Time stop_at) {
    int outstanding = 0;
    for (size_t ch = 0; ch < channels_.size(); ++ch) {
      for (int i = 0; i < in_flight_; ++i) {
        if (Start(static_cast<int>(ch))) ++outstanding;
      }
    }
    while (outstanding > 0) {
      void* tag = nullptr;
      bool ok = false;
      const auto status = cq_.AsyncNext(&tag, &ok, absl::ToChronoTime(absl::Now() +
                                                                     absl::Milliseconds(100)));
      if (status != grpc::CompletionQueue::GOT_EVENT) continue;
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      --outstanding;
      const absl::Time now = absl::Now();
      const bool measured = now >= measure_from && now < stop_at;
      if (!ok || !call->status.ok()) {
        if (measured) ++totals_.errors;
        if (totals_.errors < 3 && measured) {
          std::fprintf(stderr, "call failed: %s\n", call->status.error_message().c_str());
        }
      } else {
        if (target_ == Target::kBudget) {
          if (call->sync_response.stale()) ++totals_.stale;
          ApplyResponse(instances_[call->instance], call->sync_response);
        }
        if (measured) {
          ++totals_.calls;
          totals_.latencies_us.push_back(absl::ToDoubleMicroseconds(now - call->start));
        }
      }
      idle_.push_back(call->instance);
      if (now < stop_at && Start(call->channel)) ++outstanding;
    }
  }

  ThreadTotals& totals() { return totals_; }

 private:
  bool Start(int channel) {
    if (idle_.empty()) return false;
    auto call = std::make_unique<Call>();
    call->instance = idle_.front();
    idle_.pop_front();
    call->channel = channel;
    NextRequest(instances_[call->instance], *names_, &call->sync_request);
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    call->start = absl::Now();
    Call* raw = call.release();
    if (target_ == Target::kBudget) {
      raw->sync_reader =
          sync_stubs_[channel]->PrepareAsyncSync(&raw->context, raw->sync_request, &cq_);
      raw->sync_reader->StartCall();
      raw->sync_reader->Finish(&raw->sync_response, &raw->status, raw);
    } else {
      // Same client work as a Sync: build and serialize the request.
      raw->sync_request.SerializeToString(raw->echo_request.mutable_payload());
      raw->echo_request.set_response_bytes(echo_response_bytes_);
      raw->echo_reader =
          echo_stubs_[channel]->PrepareAsyncEcho(&raw->context, raw->echo_request, &cq_);
      raw->echo_reader->StartCall();
      raw->echo_reader->Finish(&raw->echo_response, &raw->status, raw);
    }
    return true;
  }

  const Target target_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_;
  const int in_flight_;
  std::vector<InstanceState> instances_;
  const std::vector<std::string>* names_;
  const uint32_t echo_response_bytes_;
  std::vector<std::unique_ptr<v1::RetryBudgetService::Stub>> sync_stubs_;
  std::vector<std::unique_ptr<EchoService::Stub>> echo_stubs_;
  std::deque<int> idle_;
  grpc::CompletionQueue cq_;
  ThreadTotals totals_;
};

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target, int index) {
  grpc::ChannelArguments args;
  // A connection of its own per channel (no subchannel sharing between channels).
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("retrybudget.bench.channel", index);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

// One server being measured: a child process serving on `address`.
struct ServerInRun {
  std::string name;  // as in the JSON lines
  Target target = Target::kBudget;
  std::string address;
  pid_t pid = 0;
};

// Runs --at_measure_start or --at_measure_end (`command`) for the server `pid`, if set.
void RunHook(const std::string& command, pid_t pid) {
  if (command.empty()) return;
  const std::string line = absl::StrReplaceAll(command, {{"{pid}", absl::StrCat(pid)}});
  if (const int rc = std::system(line.c_str()); rc != 0) {
    std::fprintf(stderr, "warning: \"%s\" exited with %d\n", line.c_str(), rc);
  }
}

// The words of --server_prefix.
std::vector<std::string> ServerPrefix() {
  return absl::StrSplit(absl::GetFlag(FLAGS_server_prefix), ' ', absl::SkipEmpty());
}

RunResult RunLoad(const ServerInRun& server, int tenants_per_request, int round,
                  const std::vector<std::string>& names) {
  const Target target = server.target;
  const std::string& address = server.address;
  const pid_t server_pid = server.pid;
  const int channels = absl::GetFlag(FLAGS_channels);
  const int threads = std::max(1, absl::GetFlag(FLAGS_client_threads));
  const int instances = absl::GetFlag(FLAGS_instances);
  const int pool = absl::GetFlag(FLAGS_tenant_pool);

  // Payload sizes, from a representative request (the echo server answers with as many bytes as
  // the budget server would).
  std::vector<InstanceState> sample = MakeInstances(1, tenants_per_request, pool);
  sample[0].seq = 5000;
  v1::SyncRequest sample_request;
  for (auto& b : sample[0].books) b = {100000, 3000, 200, 3500, 500};
  NextRequest(sample[0], names, &sample_request);
  const size_t request_bytes = sample_request.ByteSizeLong();
  const size_t response_bytes = TypicalResponse(sample_request).ByteSizeLong();

  std::vector<InstanceState> all = MakeInstances(instances, tenants_per_request, pool);
  // Fresh ids per run so the budget server sees new instances (seq starts at 1).
  const std::string run_tag =
      absl::StrFormat("-%s-%d-%d", server.name, tenants_per_request, round);
  for (auto& inst : all) inst.id += run_tag;

  std::vector<std::unique_ptr<LoadThread>> loaders;
  for (int t = 0; t < threads; ++t) {
    std::vector<std::shared_ptr<grpc::Channel>> chans;
    for (int c = t; c < channels; c += threads) chans.push_back(MakeChannel(address, c));
    std::vector<InstanceState> mine;
    for (int i = t; i < instances; i += threads) mine.push_back(all[i]);
    loaders.push_back(std::make_unique<LoadThread>(target, std::move(chans),
                                                   absl::GetFlag(FLAGS_in_flight),
                                                   std::move(mine), &names,
                                                   static_cast<uint32_t>(response_bytes)));
  }
  const absl::Time measure_from = absl::Now() + absl::GetFlag(FLAGS_warmup);
  const absl::Time stop_at = measure_from + absl::GetFlag(FLAGS_duration);
  double cpu_start = -1;
  std::thread cpu_sampler([&] {
    absl::SleepFor(measure_from - absl::Now());
    cpu_start = ProcessCpuSeconds(server_pid);
    RunHook(absl::GetFlag(FLAGS_at_measure_start), server_pid);
  });
  std::vector<std::thread> running;
  for (auto& l : loaders) running.emplace_back([&l, measure_from, stop_at] {
    l->Run(measure_from, stop_at);
  });
  cpu_sampler.join();
  absl::SleepFor(stop_at - absl::Now());
  const double cpu_end = ProcessCpuSeconds(server_pid);
  RunHook(absl::GetFlag(FLAGS_at_measure_end), server_pid);
  for (auto& th : running) th.join();

  RunResult r;
  r.server = server.name;
  r.round = round;
  r.tenants_per_request = tenants_per_request;
  std::vector<double> latencies;
  for (auto& l : loaders) {
    r.calls += l->totals().calls;
    r.errors += l->totals().errors;
    r.stale += l->totals().stale;
    latencies.insert(latencies.end(), l->totals().latencies_us.begin(),
                     l->totals().latencies_us.end());
  }
  r.seconds = absl::ToDoubleSeconds(absl::GetFlag(FLAGS_duration));
  r.per_second = static_cast<double>(r.calls) / r.seconds;
  r.p50_us = Percentile(latencies, 50);
  r.p99_us = Percentile(latencies, 99);
  r.p999_us = Percentile(latencies, 99.9);
  r.server_cpu_us_per_call =
      r.calls > 0 && cpu_start >= 0 ? (cpu_end - cpu_start) * 1e6 / static_cast<double>(r.calls)
                                    : -1;
  r.request_bytes = request_bytes;
  r.response_bytes = response_bytes;
  return r;
}

std::string ToJson(const RunResult& r) {
  return absl::StrFormat(
      "{\"bench\":\"server_load_run\",\"server\":\"%s\",\"round\":%d,\"tenants_per_request\":%d,"
      "\"calls\":%d,\"errors\":%d,\"stale\":%d,\"seconds\":%.2f,\"calls_per_second\":%.0f,"
      "\"p50_us\":%.1f,\"p99_us\":%.1f,\"p999_us\":%.1f,\"server_cpu_us_per_call\":%.2f,"
      "\"request_bytes\":%d,\"response_bytes\":%d}",
      r.server, r.round, r.tenants_per_request, r.calls, r.errors, r.stale, r.seconds, r.per_second,
      r.p50_us, r.p99_us, r.p999_us, r.server_cpu_us_per_call, r.request_bytes,
      r.response_bytes);
}

// How a retry-budget-server of the run is started.
enum class BudgetVariant { kInMemory, kMetrics, kDurable };

// The real server binary on port 0 with a policy that never runs dry (grants are the common
// case); kDurable: with a fresh --data_dir under /tmp; kMetrics: with its metrics endpoint on
// 127.0.0.1:0 (the launcher's own default is --metrics_listen=, metrics off).
absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> StartLoadServer(BudgetVariant variant) {
  const bool durable = variant == BudgetVariant::kDurable;
  const char* suffix = durable ? "-durable" : variant == BudgetVariant::kMetrics ? "-metrics" : "";
  const std::string dir = absl::StrCat("/tmp/retrybudget-bench-load-", getpid(), suffix);
  mkdir(dir.c_str(), 0755);
  std::vector<std::string> extra;
  if (durable) {
    const std::string data_dir = dir + "/data";
    std::system(absl::StrCat("rm -rf '", data_dir, "'").c_str());
    extra.push_back(absl::StrCat("--data_dir=", data_dir));
  }
  if (variant == BudgetVariant::kMetrics) extra.push_back("--metrics_listen=127.0.0.1:0");
  const std::string policy =
      durable ? absl::StrFormat("default_policy { capacity: %g refill_per_second: 1e9 "
                                "success_credit: 0.1 lease_ttl_ms: 5000 }\n",
                                absl::GetFlag(FLAGS_durable_capacity))
              : std::string(kUnlimitedPolicy);
  std::string binary = absl::GetFlag(FLAGS_server_bin);
  if (const std::vector<std::string> prefix = ServerPrefix(); !prefix.empty()) {
    // The launcher runs a binary: a script that execs the prefix and the server, so the pid
    // it reports is the server's.
    const std::string script = dir + "/prefixed-server.sh";
    std::ofstream(script) << "#!/bin/sh\nexec " << absl::StrJoin(prefix, " ") << " '" << binary
                          << "' \"$@\"\n";
    chmod(script.c_str(), 0755);
    binary = script;
  }
  return StartBudgetServer(binary, dir, policy, extra);
}

// `a` / `b`, or -1 when `b` is not positive (a failed run).
double Ratio(double a, double b) { return b > 0 && a >= 0 ? a / b : -1; }

// Starts one of this binary's own servers (load_servers.h) and reads its port.
absl::StatusOr<Child> StartOwnServer(const std::string& kind, std::string* address) {
  // Child::Spawn takes a path: env finds the prefix's command on $PATH and execs it in place.
  std::vector<std::string> argv = ServerPrefix();
  const bool prefixed = !argv.empty();
  if (prefixed) argv.insert(argv.begin(), "/usr/bin/env");
  argv.insert(argv.end(), {SelfExe(), absl::StrCat("--serve=", kind),
                           absl::StrCat("--cq_threads=", absl::GetFlag(FLAGS_cq_threads))});
  absl::StatusOr<Child> child = Child::Spawn(argv);
  if (!child.ok()) return child.status();
  // A server under a profiler (valgrind) starts many times slower.
  absl::StatusOr<std::string> port =
      child->ReadLine(prefixed ? absl::Seconds(120) : absl::Seconds(10));
  if (!port.ok()) {
    return absl::UnavailableError(
        absl::StrCat("--serve=", kind, " did not print its port: ", port.status().message()));
  }
  *address = absl::StrCat("127.0.0.1:", *port);
  return child;
}

int Main() {
  const int pool = absl::GetFlag(FLAGS_tenant_pool);
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  std::vector<std::string> names;
  for (int i = 0; i < pool; ++i) names.push_back(TenantName(i));
  std::vector<int> per_request_counts;
  for (const std::string& text : absl::GetFlag(FLAGS_tenants_per_request)) {
    int n = 0;
    if (!absl::SimpleAtoi(text, &n) || n < 1 || n > 64 || n > pool) {
      std::fprintf(stderr, "--tenants_per_request: \"%s\" is not a count in 1..%d\n",
                   text.c_str(), std::min(64, pool));
      return 1;
    }
    per_request_counts.push_back(n);
  }

  // The servers, in the order each round runs them.
  const std::map<std::string, Target> kKnown = {
      {"echo_callback", Target::kEcho},
      {"retry-budget-server", Target::kBudget},
      {"retry-budget-server-metrics", Target::kBudget},
      {"retry-budget-server-durable", Target::kBudget},
      {"echo_cq", Target::kEcho},
      {"budget_cq", Target::kBudget}};
  std::vector<Child> children;
  std::vector<std::unique_ptr<testing::ServerUnderTest>> budget_servers;
  std::vector<ServerInRun> servers;
  for (absl::string_view name_view : absl::StrSplit(absl::GetFlag(FLAGS_servers), ',')) {
    const std::string name(name_view);
    auto known = kKnown.find(name);
    if (known == kKnown.end()) {
      std::fprintf(stderr, "--servers: unknown server \"%s\"\n", name.c_str());
      return 1;
    }
    const Target target = known->second;
    ServerInRun server{.name = name, .target = target, .address = "", .pid = 0};
    if (absl::StartsWith(name, "retry-budget-server")) {
      absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> budget =
          StartLoadServer(name == "retry-budget-server-durable"   ? BudgetVariant::kDurable
                          : name == "retry-budget-server-metrics" ? BudgetVariant::kMetrics
                                                                  : BudgetVariant::kInMemory);
      if (!budget.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(),
                     std::string(budget.status().message()).c_str());
        return 1;
      }
      server.address = (*budget)->address();
      server.pid = (*budget)->pid();
      budget_servers.push_back(*std::move(budget));
    } else {
      absl::StatusOr<Child> child = StartOwnServer(name, &server.address);
      if (!child.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(),
                     std::string(child.status().message()).c_str());
        return 1;
      }
      server.pid = child->pid();
      children.push_back(*std::move(child));
    }
    servers.push_back(server);
  }

  // Per tenants-per-request, per server: each round's result.
  std::map<int, std::map<std::string, std::vector<RunResult>>> results;
  for (int per_request : per_request_counts) {
    for (int round = 0; round < rounds; ++round) {
      for (const ServerInRun& server : servers) {
        const RunResult r = RunLoad(server, per_request, round, names);
        std::printf("%s\n", ToJson(r).c_str());
        std::fflush(stdout);
        results[per_request][server.name].push_back(r);
      }
    }
  }

  // Ratios within each round, then the median over the rounds.
  auto median_ratio = [&](int per_request, const std::string& a, const std::string& b,
                          double RunResult::*field) {
    std::vector<double> ratios;
    for (int round = 0; round < rounds; ++round) {
      ratios.push_back(Ratio(results[per_request][a][round].*field,
                             results[per_request][b][round].*field));
    }
    return Median(ratios, -1);
  };
  auto median_of = [&](int per_request, const std::string& server, double RunResult::*field) {
    std::vector<double> values;
    for (const RunResult& r : results[per_request][server]) values.push_back(r.*field);
    return Median(values, -1);
  };
  // Each reported ratio: its name, and which server's field over which. The first is the
  // throughput target's; the last three answer the API question: the same work on the
  // completion-queue API vs the callback API.
  struct RatioSpec {
    const char* name;
    const char* server;
    const char* baseline;
    double RunResult::*field;
  };
  constexpr RatioSpec kRatios[] = {
      {"throughput_vs_echo", "retry-budget-server", "echo_callback", &RunResult::per_second},
      {"server_cpu_per_call_vs_echo", "retry-budget-server", "echo_callback",
       &RunResult::server_cpu_us_per_call},
      {"p99_vs_echo", "retry-budget-server", "echo_callback", &RunResult::p99_us},
      {"echo_cq_vs_echo_callback", "echo_cq", "echo_callback", &RunResult::per_second},
      {"budget_cq_vs_budget_callback", "budget_cq", "retry-budget-server",
       &RunResult::per_second},
      {"budget_cq_vs_echo_cq", "budget_cq", "echo_cq", &RunResult::per_second},
      {"durable_vs_memory", "retry-budget-server-durable", "retry-budget-server",
       &RunResult::per_second},
      {"metrics_vs_no_metrics", "retry-budget-server-metrics", "retry-budget-server",
       &RunResult::per_second},
      {"metrics_cpu_vs_no_metrics", "retry-budget-server-metrics", "retry-budget-server",
       &RunResult::server_cpu_us_per_call},
      {"metrics_on_throughput_vs_echo", "retry-budget-server-metrics", "echo_callback",
       &RunResult::per_second},
      {"metrics_on_server_cpu_per_call_vs_echo", "retry-budget-server-metrics", "echo_callback",
       &RunResult::server_cpu_us_per_call},
  };
  auto ran = [&](const std::string& name) {
    return std::any_of(servers.begin(), servers.end(),
                       [&](const ServerInRun& s) { return s.name == name; });
  };
  std::vector<std::string> ratio_fields, target_fields, median_fields;
  for (int per_request : per_request_counts) {
    double throughput_ratio = 0;
    double cpu_ratio = 0;
    for (const RatioSpec& spec : kRatios) {
      if (!ran(spec.server) || !ran(spec.baseline)) continue;
      const double ratio = median_ratio(per_request, spec.server, spec.baseline, spec.field);
      if (&spec == &kRatios[0]) throughput_ratio = ratio;
      if (&spec == &kRatios[1]) cpu_ratio = ratio;
      ratio_fields.push_back(
          absl::StrFormat("\"%s_%dt\":%.3f", spec.name, per_request, ratio));
    }
    if (ran("retry-budget-server") && ran("echo_callback")) {
      target_fields.push_back(absl::StrFormat("\"throughput_at_least_80pct_of_echo_%dt\":%s",
                                              per_request,
                                              throughput_ratio >= 0.8 ? "true" : "false"));
      target_fields.push_back(absl::StrFormat("\"throughput_at_least_90pct_of_echo_%dt\":%s",
                                              per_request,
                                              throughput_ratio >= 0.9 ? "true" : "false"));
      target_fields.push_back(absl::StrFormat("\"server_cpu_at_most_1_2x_echo_%dt\":%s",
                                              per_request, cpu_ratio <= 1.2 ? "true" : "false"));
    }
    for (const ServerInRun& server : servers) {
      median_fields.push_back(absl::StrFormat(
          "\"%s_%dt\":{\"calls_per_second\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,"
          "\"p999_us\":%.1f,\"server_cpu_us_per_call\":%.2f}",
          server.name, per_request, median_of(per_request, server.name, &RunResult::per_second),
          median_of(per_request, server.name, &RunResult::p50_us),
          median_of(per_request, server.name, &RunResult::p99_us),
          median_of(per_request, server.name, &RunResult::p999_us),
          median_of(per_request, server.name, &RunResult::server_cpu_us_per_call)));
    }
  }
  std::printf("{\"bench\":\"server_load\",\"channels\":%d,\"in_flight_per_channel\":%d,"
              "\"instances\":%d,\"tenant_pool\":%d,\"rounds\":%d,\"cq_threads\":%d,"
              "\"ratios\":{%s},\"targets\":{%s},\"medians\":{%s}}\n",
              absl::GetFlag(FLAGS_channels), absl::GetFlag(FLAGS_in_flight),
              absl::GetFlag(FLAGS_instances), pool, rounds, absl::GetFlag(FLAGS_cq_threads),
              absl::StrJoin(ratio_fields, ",").c_str(), absl::StrJoin(target_fields, ",").c_str(),
              absl::StrJoin(median_fields, ",").c_str());
  std::fflush(stdout);
  for (Child& child : children) child.Stop(SIGTERM, absl::Seconds(5));
  for (auto& budget : budget_servers) (void)budget->Stop(SIGTERM, absl::Seconds(5));
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_serve).empty()) {
    return retrybudget::bench::Serve(absl::GetFlag(FLAGS_serve), absl::GetFlag(FLAGS_cq_threads));
  }
  return retrybudget::bench::Main();
}
