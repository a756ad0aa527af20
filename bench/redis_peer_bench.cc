// The do-it-yourself peer: the usual home-grown fleet-wide retry budget is a token bucket in
// Redis, one EVALSHA of a Lua script per retry decision. This bench runs both in one process
// against real servers started here:
//   redis     a real redis-server on a free loopback port; hiredis; the Lua token bucket below;
//             one synchronous EVALSHA per decision, one connection per thread.
//   ours      the real client library (BudgetClient with its refresher thread) leasing from the
//             real retry-budget-server binary; a decision is TenantBudget::TryAcquire().
// Both budgets are configured so every decision can be allowed (capacity and refill 1e9): the
// bench measures what a decision costs, not the policy.
//
// Two comparisons, both reported:
//   per decision    decisions/s and per-decision latency (p50/p99/p999; each decision timed on
//                   its own with steady_clock, whose ~20-30 ns overhead is included for both)
//   per round trip  one Sync RPC (1 tenant, sequential, blocking stub) vs one EVALSHA: the cost
//                   of one trip to the shared state; plus how many decisions one Sync paid for.
//
// Output: one JSON line per measurement, then {"bench":"redis_peer",...} with the ratios.
#include <hiredis/hiredis.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/v1/budget_mock.grpc.pb.h"

ABSL_FLAG(absl::Duration, duration, absl::Seconds(2), "measured time per decision loop");
ABSL_FLAG(int, round_trips, 5000, "sequential round trips timed per system");
ABSL_FLAG(std::string, server_bin, RETRYBUDGET_SERVER_BIN, "the retry-budget-server binary");
ABSL_FLAG(std::string, redis_bin, "/usr/bin/redis-server", "the redis-server binary");

namespace retrybudget::bench {
namespace {

// A token bucket per key: refill by elapsed time (Redis server clock), take one token if there is
// one. Returns 1 (allowed) or 0 (denied). What a team writes when it rolls its own.
constexpr char kTokenBucketLua[] = R"lua(
local capacity = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens = tonumber(b[1]) or capacity
local ts = tonumber(b[2]) or now
tokens = math.min(capacity, tokens + math.max(0, now - ts) * rate)
local allowed = 0
if tokens >= 1 then
  tokens = tokens - 1
  allowed = 1
end
redis.call('HSET', KEYS[1], 'tokens', tokens, 'ts', now)
return allowed
)lua";

using SteadyClock = std::chrono::steady_clock;

struct Measure {
  std::string system;
  std::string what;  // "decision" or "round_trip"
  int threads = 1;
  uint64_t count = 0;
  uint64_t allowed = 0;
  double seconds = 0;
  double per_second = 0;
  double p50_ns = 0, p99_ns = 0, p999_ns = 0;
  std::string extra;  // more JSON fields, starting with ','
};

std::string ToJson(const Measure& m) {
  return absl::StrFormat(
      "{\"bench\":\"redis_peer_run\",\"system\":\"%s\",\"what\":\"%s\",\"threads\":%d,"
      "\"count\":%d,\"allowed\":%d,\"seconds\":%.2f,\"per_second\":%.0f,\"p50_ns\":%.0f,"
      "\"p99_ns\":%.0f,\"p999_ns\":%.0f%s}",
      m.system, m.what, m.threads, m.count, m.allowed, m.seconds, m.per_second, m.p50_ns,
      m.p99_ns, m.p999_ns, m.extra);
}

// Runs `decide` (returns allowed) on `threads` threads for --duration, timing every call.
// Latency samples are kept for at most 2M calls per thread (enough for p999).
template <typename MakeDecider>
Measure RunDecisions(const std::string& system, int threads, MakeDecider make_decider) {
  struct PerThread {
    uint64_t count = 0, allowed = 0;
    std::vector<double> ns;
  };
  std::vector<PerThread> per(threads);
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  const absl::Duration duration = absl::GetFlag(FLAGS_duration);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      auto decide = make_decider(t);
      PerThread& p = per[t];
      p.ns.reserve(2'000'000);
      ready.fetch_add(1);
      while (!go.load()) {
      }
      const auto end = SteadyClock::now() + absl::ToChronoNanoseconds(duration);
      auto now = SteadyClock::now();
      while (now < end) {
        const auto start = now;
        const bool ok = decide();
        now = SteadyClock::now();
        ++p.count;
        p.allowed += ok ? 1 : 0;
        if (p.ns.size() < p.ns.capacity()) {
          p.ns.push_back(std::chrono::duration<double, std::nano>(now - start).count());
        }
      }
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true);
  for (auto& th : pool) th.join();
  Measure m;
  m.system = system;
  m.what = "decision";
  m.threads = threads;
  m.seconds = absl::ToDoubleSeconds(duration);
  std::vector<double> all;
  for (auto& p : per) {
    m.count += p.count;
    m.allowed += p.allowed;
    all.insert(all.end(), p.ns.begin(), p.ns.end());
  }
  m.per_second = static_cast<double>(m.count) / m.seconds;
  m.p50_ns = Percentile(all, 50);
  m.p99_ns = Percentile(all, 99);
  m.p999_ns = Percentile(all, 99.9);
  return m;
}

// ---- redis ----

struct RedisConn {
  redisContext* c = nullptr;
  ~RedisConn() {
    if (c != nullptr) redisFree(c);
  }
};

absl::StatusOr<std::unique_ptr<RedisConn>> ConnectRedis(int port) {
  auto conn = std::make_unique<RedisConn>();
  conn->c = redisConnect("127.0.0.1", port);
  if (conn->c == nullptr || conn->c->err) {
    return absl::UnavailableError(
        absl::StrCat("redis connect: ", conn->c ? conn->c->errstr : "out of memory"));
  }
  return conn;
}

// One EVALSHA: true when the script allowed the decision.
bool EvalBucket(redisContext* c, const std::string& sha) {
  auto* reply = static_cast<redisReply*>(
      redisCommand(c, "EVALSHA %s 1 retrybudget:peer 1000000000 1000000000", sha.c_str()));
  const bool ok = reply != nullptr && reply->type == REDIS_REPLY_INTEGER && reply->integer == 1;
  if (reply != nullptr) freeReplyObject(reply);
  return ok;
}

// ---- ours ----

// The real stub to the real server, counting Syncs (decisions per round trip).
class CountingStub final : public v1::MockRetryBudgetServiceStub {
 public:
  CountingStub(std::shared_ptr<grpc::Channel> channel, std::atomic<uint64_t>* syncs)
      : real_(v1::RetryBudgetService::NewStub(channel)), syncs_(syncs) {}
  grpc::Status Sync(grpc::ClientContext* context, const v1::SyncRequest& request,
                    v1::SyncResponse* response) override {
    syncs_->fetch_add(1, std::memory_order_relaxed);
    return real_->Sync(context, request, response);
  }

 private:
  std::unique_ptr<v1::RetryBudgetService::Stub> real_;
  std::atomic<uint64_t>* syncs_;
};

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "redis_peer: %s\n", std::string(s.message()).c_str());
  return 1;
}

int Main() {
  const std::string dir = absl::StrCat("/tmp/retrybudget-bench-redis-", getpid());
  mkdir(dir.c_str(), 0755);

  // redis-server cannot listen on port 0: take a port the kernel just handed out.
  absl::StatusOr<int> redis_port = PickFreeLoopbackPort();
  if (!redis_port.ok()) return Fail(redis_port.status());
  absl::StatusOr<Child> redis = Child::Spawn(
      {absl::GetFlag(FLAGS_redis_bin), "--port", absl::StrCat(*redis_port), "--bind",
       "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning"});
  if (!redis.ok()) return Fail(redis.status());
  if (!WaitForTcpPort(*redis_port, absl::Seconds(10))) {
    return Fail(absl::UnavailableError("redis-server did not start"));
  }
  auto admin = ConnectRedis(*redis_port);
  if (!admin.ok()) return Fail(admin.status());
  std::string sha;
  {
    auto* reply = static_cast<redisReply*>(
        redisCommand((*admin)->c, "SCRIPT LOAD %s", kTokenBucketLua));
    if (reply == nullptr || reply->type != REDIS_REPLY_STRING) {
      return Fail(absl::InternalError("SCRIPT LOAD failed"));
    }
    sha.assign(reply->str, reply->len);
    freeReplyObject(reply);
  }

  absl::StatusOr<std::unique_ptr<testing::ServerUnderTest>> budget_server =
      StartBudgetServer(absl::GetFlag(FLAGS_server_bin), dir, kUnlimitedPolicy);
  if (!budget_server.ok()) return Fail(budget_server.status());
  const std::string target = (*budget_server)->address();
  std::atomic<uint64_t> syncs{0};
  ClientOptions options;
  options.target = target;
  auto client = CreateBudgetClientForTesting(
      options,
      std::make_unique<CountingStub>(
          grpc::CreateChannel(target, grpc::InsecureChannelCredentials()), &syncs),
      /*start_refresher_thread=*/true);
  if (!client.ok()) return Fail(client.status());
  absl::StatusOr<TenantBudget*> budget = (*client)->Tenant("peer");
  if (!budget.ok()) return Fail(budget.status());
  // Wait for the first lease (a cold client denies until its first grant arrives), then warm
  // the demand estimate for a moment so the lease is sized for the loop.
  const absl::Time lease_deadline = absl::Now() + absl::Seconds(5);
  while (!(*budget)->Stats().lease_active && absl::Now() < lease_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (absl::Time until = absl::Now() + absl::Milliseconds(500); absl::Now() < until;) {
    (*budget)->TryAcquire();
  }

  std::vector<Measure> results;
  for (int threads : {1, 2}) {
    const uint64_t syncs_before = syncs.load();
    const TenantStats before = (*budget)->Stats();
    Measure ours = RunDecisions("ours", threads, [&](int) {
      TenantBudget* b = *budget;
      return [b] { return b->TryAcquire(); };
    });
    const uint64_t syncs_during = syncs.load() - syncs_before;
    const TenantStats after = (*budget)->Stats();
    ours.extra = absl::StrFormat(",\"syncs\":%d,\"decisions_per_sync\":%.0f,"
                                 "\"tokens_received\":%d",
                                 syncs_during,
                                 syncs_during ? double(ours.count) / double(syncs_during) : -1.0,
                                 after.tokens_received - before.tokens_received);
    results.push_back(ours);
    std::printf("%s\n", ToJson(ours).c_str());
    std::fflush(stdout);

    std::vector<std::unique_ptr<RedisConn>> conns;
    for (int t = 0; t < threads; ++t) {
      auto c = ConnectRedis(*redis_port);
      if (!c.ok()) return Fail(c.status());
      conns.push_back(*std::move(c));
    }
    Measure peer = RunDecisions("redis", threads, [&](int t) {
      redisContext* c = conns[t]->c;
      return [c, &sha] { return EvalBucket(c, sha); };
    });
    peer.extra = ",\"decisions_per_round_trip\":1";
    results.push_back(peer);
    std::printf("%s\n", ToJson(peer).c_str());
    std::fflush(stdout);
  }

  // Per round trip: one Sync (1 tenant, realistic counters, fresh instance) vs one EVALSHA.
  const int trips = absl::GetFlag(FLAGS_round_trips);
  auto stub = v1::RetryBudgetService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  std::vector<double> sync_ns, eval_ns;
  uint64_t received = 0;
  for (int i = 0; i < trips + 100; ++i) {
    v1::SyncRequest request;
    request.set_instance_id("bench-round-trip-instance");
    request.set_seq(static_cast<uint64_t>(i + 1));
    v1::TenantSync* t = request.add_tenants();
    t->set_tenant("peer-rt");
    t->set_successes(static_cast<uint64_t>(i) * 20);
    t->set_tokens_received(received);
    t->set_want(10);
    v1::SyncResponse response;
    grpc::ClientContext context;
    const auto start = SteadyClock::now();
    const grpc::Status st = stub->Sync(&context, request, &response);
    const auto end = SteadyClock::now();
    if (!st.ok()) return Fail(absl::UnavailableError(st.error_message()));
    if (response.tenants_size() == 1) received += response.tenants(0).granted();
    if (i >= 100) sync_ns.push_back(std::chrono::duration<double, std::nano>(end - start).count());
  }
  for (int i = 0; i < trips + 100; ++i) {
    const auto start = SteadyClock::now();
    EvalBucket((*admin)->c, sha);
    const auto end = SteadyClock::now();
    if (i >= 100) eval_ns.push_back(std::chrono::duration<double, std::nano>(end - start).count());
  }
  auto trip = [&](const std::string& system, std::vector<double>& ns) {
    Measure m;
    m.system = system;
    m.what = "round_trip";
    m.count = ns.size();
    double sum = 0;
    for (double v : ns) sum += v;
    m.seconds = sum / 1e9;
    m.per_second = m.seconds > 0 ? static_cast<double>(m.count) / m.seconds : 0;
    m.p50_ns = Percentile(ns, 50);
    m.p99_ns = Percentile(ns, 99);
    m.p999_ns = Percentile(ns, 99.9);
    std::printf("%s\n", ToJson(m).c_str());
    return m;
  };
  const Measure sync_trip = trip("ours_sync_rpc", sync_ns);
  const Measure eval_trip = trip("redis_evalsha", eval_ns);

  std::vector<std::string> ratios;
  for (int i = 0; i + 1 < static_cast<int>(results.size()); i += 2) {
    const Measure& o = results[i];
    const Measure& r = results[i + 1];
    ratios.push_back(absl::StrFormat("\"decisions_per_second_ours_vs_redis_%dt\":%.1f", o.threads,
                                     r.per_second > 0 ? o.per_second / r.per_second : -1));
    ratios.push_back(absl::StrFormat("\"p50_latency_redis_vs_ours_%dt\":%.1f", o.threads,
                                     o.p50_ns > 0 ? r.p50_ns / o.p50_ns : -1));
    ratios.push_back(absl::StrFormat("\"p99_latency_redis_vs_ours_%dt\":%.1f", o.threads,
                                     o.p99_ns > 0 ? r.p99_ns / o.p99_ns : -1));
    ratios.push_back(absl::StrFormat("\"allowed_fraction_ours_%dt\":%.4f", o.threads,
                                     o.count ? double(o.allowed) / double(o.count) : 0));
  }
  ratios.push_back(absl::StrFormat("\"round_trip_p50_sync_vs_evalsha\":%.2f",
                                   eval_trip.p50_ns > 0 ? sync_trip.p50_ns / eval_trip.p50_ns : -1));
  ratios.push_back(absl::StrFormat("\"round_trip_p99_sync_vs_evalsha\":%.2f",
                                   eval_trip.p99_ns > 0 ? sync_trip.p99_ns / eval_trip.p99_ns : -1));
  std::printf("{\"bench\":\"redis_peer\",\"ratios\":{%s}}\n", absl::StrJoin(ratios, ",").c_str());
  std::fflush(stdout);

  (void)(*client)->Shutdown();
  (void)(*budget_server)->Stop(SIGTERM, absl::Seconds(5));
  redis->Stop(SIGTERM, absl::Seconds(5));
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return 0;
}

}  // namespace
}  // namespace retrybudget::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return retrybudget::bench::Main();
}
