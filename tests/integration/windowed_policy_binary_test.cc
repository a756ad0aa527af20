// The windowed ratio policy through the real binary over gRPC: instances that report requests
// and spend every token they are granted at once are granted, in every window of ttl ending at
// a retry, at most floor * ttl + retry_ratio * the requests they reported in it; also across a
// kill -9 and restart of the server with --data_dir (DESIGN.md "The windowed ratio policy").
// Times are the test's clock: a request counts from when its Sync was sent (the server deposits
// it later, at receipt), a token from when its grant was received (granted earlier), each
// within the Sync's round trip: the requests counted in a window are those of the window widened
// by kSlack on both sides.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

constexpr double kRatio = 0.5;
constexpr double kFloorPerSecond = 5;
constexpr int64_t kTtlMs = 2000;
constexpr double kFloor = kFloorPerSecond * kTtlMs / 1000.0;  // 10
const absl::Duration kTtl = absl::Milliseconds(kTtlMs);
const absl::Duration kSlack = absl::Milliseconds(100);

std::string WritePolicy(const std::string& dir) {
  const std::string path = dir + "/policy.textproto";
  WriteFile(path, absl::StrCat("tenants { tenant: \"w\" policy { retry_ratio: ", kRatio,
                               " min_retries_per_second: ", kFloorPerSecond, " ttl_ms: ", kTtlMs,
                               " } }\n"));
  return path;
}

// What every instance did, with the test's times.
class Record {
 public:
  void Requests(absl::Time at, uint64_t n) {
    absl::MutexLock lock(&mu_);
    for (uint64_t i = 0; i < n; ++i) requests_.push_back(at);
  }
  void Spent(absl::Time at, uint64_t n) {
    absl::MutexLock lock(&mu_);
    for (uint64_t i = 0; i < n; ++i) spends_.push_back(at);
  }
  uint64_t spent() {
    absl::MutexLock lock(&mu_);
    return spends_.size();
  }

  // Checks every window of ttl that ends at a spend; returns the fullest window's spending over
  // its bound (at most 1 when the bound holds).
  double CheckBound() {
    absl::MutexLock lock(&mu_);
    std::sort(requests_.begin(), requests_.end());
    std::sort(spends_.begin(), spends_.end());
    auto count = [](const std::vector<absl::Time>& v, absl::Time from, absl::Time to) {
      return static_cast<double>(std::upper_bound(v.begin(), v.end(), to) -
                                 std::upper_bound(v.begin(), v.end(), from));
    };
    double fullest = 0;
    for (const absl::Time x : spends_) {
      const double spent = count(spends_, x - kTtl, x);
      const double bound = kFloor + kRatio * count(requests_, x - kTtl - kSlack, x + kSlack);
      EXPECT_LE(spent, bound) << "the window ending " << absl::FormatDuration(x - spends_[0])
                              << " after the first spend";
      fullest = std::max(fullest, spent / bound);
    }
    return fullest;
  }

 private:
  absl::Mutex mu_;
  std::vector<absl::Time> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> spends_ ABSL_GUARDED_BY(mu_);
};

// An instance: reports a few requests a Sync (more while `busy`), spends every token it is
// granted at once, until `stop`. Its first Sync is a baseline with no requests.
void RunInstance(ServerProcess& server, const std::string& id, const std::atomic<bool>& stop,
                 const std::atomic<bool>& busy, Record& record) {
  ServerConnection c = server.Connect();
  c.deadline = absl::Seconds(2);
  uint64_t requests = 0;
  uint64_t received = 0;
  for (uint64_t seq = 1; !stop.load(); ++seq) {
    const uint64_t more = seq == 1 ? 0 : (busy.load() ? 6 : 0);
    v1::SyncRequest request = SyncOf(id, seq, "w", 5, received, 0, received);
    request.mutable_tenants(0)->set_requests(requests + more);
    request.mutable_tenants(0)->set_retries_allowed(received);
    const absl::Time sent = absl::Now();
    v1::SyncResponse response;
    if (!c.Sync(request, &response).ok() || response.tenants_size() != 1 ||
        response.tenants(0).has_error()) {
      continue;  // the next request reports the same requests again (cumulative)
    }
    requests += more;
    record.Requests(sent, more);
    const uint64_t granted = response.tenants(0).granted();
    received += granted;
    record.Spent(absl::Now(), granted);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

class WindowedPolicyBinaryTest : public ::testing::Test {
 protected:
  std::vector<std::string> Args() {
    return {"--policy=" + policy_, "--data_dir=" + data_dir_, "--snapshot_interval=200ms"};
  }

  // Runs `n` instances against `server` for `run` (busy for the first `busy_for`).
  void RunFleet(ServerProcess& server, int n, const std::string& prefix, absl::Duration run,
                absl::Duration busy_for, std::function<void()> midway = {}) {
    std::atomic<bool> stop{false};
    std::atomic<bool> busy{true};
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([&, i] {
        RunInstance(server, absl::StrCat(prefix, i), stop, busy, record_);
      });
    }
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(busy_for));
    busy = false;
    std::this_thread::sleep_for(absl::ToChronoMilliseconds(run - busy_for));
    if (midway) midway();
    stop = true;
    for (auto& t : threads) t.join();
  }

  ScopedTempDir dir_;
  const std::string data_dir_ = dir_.path() + "/data";
  const std::string policy_ = WritePolicy(dir_.path());
  Record record_;
};

TEST_F(WindowedPolicyBinaryTest, GrantsStayWithinTheWindowedBound) {
  auto server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  // Busy, then quiet: the floor alone funds the quiet windows once the deposits left them.
  RunFleet(*server, 3, "a", absl::Seconds(6), absl::Seconds(3));
  const double fullest = record_.CheckBound();
  const uint64_t spent = record_.spent();
  std::printf("windowed over gRPC: %llu tokens spent, fullest window at %.2f of its bound\n",
              static_cast<unsigned long long>(spent), fullest);
  EXPECT_GT(spent, 2 * kFloor) << "the deposits funded nothing";
  v1::BudgetStatus status;
  ServerConnection c = server->Connect();
  ASSERT_TRUE(c.GetBudget("w", &status).ok());
  EXPECT_GE(status.tokens(), 0);
  EXPECT_DOUBLE_EQ(status.window_deposits(), 0);  // quiet for more than a window
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST_F(WindowedPolicyBinaryTest, KillNineAndRestartKeepTheWindowedBound) {
  auto server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  // Killed while the instances are busy; a new server on the same data directory serves the
  // next ones (new instances: the restarted server knows none) right away.
  RunFleet(*server, 3, "before", absl::Milliseconds(2500), absl::Milliseconds(2500),
           [&] { ASSERT_EQ(server->Stop(SIGKILL), -SIGKILL); });
  const uint64_t before = record_.spent();
  server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  RunFleet(*server, 3, "after", absl::Seconds(4), absl::Seconds(2));
  const double fullest = record_.CheckBound();
  std::printf("windowed across kill -9: %llu tokens spent before, %llu after; fullest window at "
              "%.2f of its bound\n",
              static_cast<unsigned long long>(before),
              static_cast<unsigned long long>(record_.spent() - before), fullest);
  EXPECT_GT(record_.spent(), before) << "the restarted server granted nothing";
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace retrybudget::testing
