// Persistence through the real binary (--data_dir): a clean restart (SIGTERM) restores exact
// levels, kill -9 never creates tokens (counting the grants the clients really received), and a
// damaged snapshot stops the server from starting (exit code 2, the file named).
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kRefillPerSecond = 2;
constexpr double kCapacity = 10'000;
// Levels are doubles that went through a refill and a snapshot.
constexpr double kEpsilon = 1e-6;

std::string WritePolicy(const std::string& dir) {
  const std::string path = dir + "/policy.textproto";
  WriteFile(path, absl::StrCat("tenants { tenant: \"t\" policy { capacity: ", kCapacity,
                               " refill_per_second: ", kRefillPerSecond,
                               " success_credit: 0 lease_ttl_ms: 60000 } }\n"));
  return path;
}

// A level and when it was read: the server computed it between `sent` and `received`.
struct Level {
  v1::BudgetStatus budget;
  absl::Time sent;
  absl::Time received;
};

Level ReadLevel(ServerConnection& connection) {
  Level level;
  level.sent = absl::Now();
  const grpc::Status s = connection.GetBudget("t", &level.budget);
  EXPECT_TRUE(s.ok()) << s.error_message();
  level.received = absl::Now();
  return level;
}

// The most refill that can have happened between two readings.
double RefillBetween(const Level& first, const Level& second) {
  return kRefillPerSecond * absl::ToDoubleSeconds(second.received - first.sent);
}

class PersistenceBinaryTest : public ::testing::Test {
 protected:
  std::vector<std::string> Args() {
    return {"--policy=" + policy_, "--data_dir=" + data_dir_, "--snapshot_interval=200ms"};
  }

  // Sends `instance`'s request for `want` tokens of "t" (with these counters) at *seq, then
  // *seq + 1, ... until it is granted something, for up to 20 s, and returns the grant. A grant
  // never exceeds the limit already on disk, and the server's store thread raises the limit off
  // the Sync's path: the first Sync of a budget (or the first after a restart) gets nothing
  // while its reservation is written.
  static uint64_t SyncUntilGranted(ServerConnection& c, const std::string& instance, uint64_t* seq,
                                   uint64_t want, uint64_t received = 0, uint64_t returned = 0,
                                   uint64_t spent = 0) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    for (;; ++*seq) {
      v1::SyncResponse r;
      const grpc::Status s =
          c.Sync(SyncOf(instance, *seq, "t", want, received, returned, spent), &r);
      EXPECT_TRUE(s.ok()) << s.error_message();
      if (!s.ok()) return 0;
      if (r.tenants(0).granted() > 0 || absl::Now() > deadline) return r.tenants(0).granted();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  ScopedTempDir dir_;
  const std::string data_dir_ = dir_.path() + "/data";
  const std::string policy_ = WritePolicy(dir_.path());
};

TEST_F(PersistenceBinaryTest, CleanRestartRestoresExactLevelsAndTotals) {
  auto server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  uint64_t a_seq = 1;
  ASSERT_EQ(SyncUntilGranted(c, "a", &a_seq, 300), 300u);
  ASSERT_TRUE(c.Sync(SyncOf("b", 1, "t", 200), &r).ok());
  ASSERT_EQ(r.tenants(0).granted(), 200u);
  // a spent 70 of its 300 and gives 30 back.
  ASSERT_TRUE(c.Sync(SyncOf("a", a_seq + 1, "t", 0, 300, 30, 70), &r).ok());
  const Level before = ReadLevel(c);
  ASSERT_EQ(before.budget.granted_total(), 500u);
  EXPECT_NEAR(before.budget.tokens(), kCapacity - 470, 1);  // plus refill for the test's time

  ASSERT_EQ(server->Stop(SIGTERM), 0) << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr("final snapshot written"));

  server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  c = server->Connect();
  const Level after = ReadLevel(c);
  // Exact: the same level, plus only the refill for the time it was down.
  EXPECT_GE(after.budget.tokens(), before.budget.tokens() - kEpsilon);
  EXPECT_LE(after.budget.tokens(), before.budget.tokens() + RefillBetween(before, after) + kEpsilon);
  EXPECT_EQ(after.budget.granted_total(), before.budget.granted_total());
  EXPECT_EQ(after.budget.returned_total(), before.budget.returned_total());
  EXPECT_EQ(after.budget.retries_total(), before.budget.retries_total());
  EXPECT_EQ(after.budget.wanted_total(), before.budget.wanted_total());
  EXPECT_THAT(server->Output(), HasSubstr("1 budget(s) recovered"));

  // The instances came back too: b's next request is applied as a continuation (its 200 tokens
  // received count), not refused or taken as new history.
  uint64_t b_seq = 2;
  EXPECT_EQ(SyncUntilGranted(c, "b", &b_seq, 10, 200, 200, 0), 10u);
  const Level last = ReadLevel(c);
  EXPECT_EQ(last.budget.returned_total(), before.budget.returned_total() + 200);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

// A budget deleted (DeleteBudget) before a clean restart and created again after it by the next
// Sync: the tokens an instance got from the deleted one and returns now are a baseline for the
// new one, never credited to it (the snapshot keeps no history of a deleted budget).
TEST_F(PersistenceBinaryTest, ADeletedBudgetsTokensReturnedAfterARestartDoNotFillItsSuccessor) {
  auto server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  uint64_t a_seq = 1;
  ASSERT_EQ(SyncUntilGranted(c, "a", &a_seq, 300), 300u);
  ASSERT_TRUE(c.DeleteBudget("t").ok());
  ASSERT_EQ(server->Stop(SIGTERM), 0) << server->Output();

  server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  c = server->Connect();
  // A new "t": b takes 1,000 and spends them, so the bucket has room below its capacity.
  uint64_t b_seq = 1;
  ASSERT_EQ(SyncUntilGranted(c, "b", &b_seq, 1000), 1000u);
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("b", b_seq + 1, "t", 0, 1000, 0, 1000), &r).ok());
  const Level before = ReadLevel(c);
  EXPECT_LT(before.budget.tokens(), kCapacity - 900);
  // a gives back the 300 the deleted budget granted it.
  ASSERT_TRUE(c.Sync(SyncOf("a", a_seq + 1, "t", 0, 300, 300, 0), &r).ok());
  ASSERT_EQ(r.tenants(0).error().code(), 0) << r.tenants(0).error().message();
  const Level after = ReadLevel(c);
  EXPECT_LE(after.budget.tokens(), before.budget.tokens() + RefillBetween(before, after) + kEpsilon);
  EXPECT_EQ(after.budget.returned_total(), 0u);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

TEST_F(PersistenceBinaryTest, KillNineAfterGrantsCreatesNoTokens) {
  auto server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  const absl::Time start = absl::Now();
  ServerConnection reader = server->Connect();

  // Four instances lease small batches as fast as they can and never return anything, so the
  // level only goes down (but for refill). The kill lands while they run.
  constexpr int kInstances = 4;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received_total{0};
  std::vector<std::thread> workers;
  for (int i = 0; i < kInstances; ++i) {
    workers.emplace_back([&, i] {
      ServerConnection c = server->Connect();
      c.deadline = absl::Seconds(2);
      uint64_t received = 0;
      for (uint64_t seq = 1; !stop.load(); ++seq) {
        v1::SyncResponse r;
        if (!c.Sync(SyncOf(absl::StrCat("w", i), seq, "t", 7, received, 0, received), &r).ok()) {
          continue;
        }
        received += r.tenants(0).granted();
        received_total += r.tenants(0).granted();
      }
    });
  }
  while (received_total.load() < 2000 && absl::Now() - start < absl::Seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const Level before = ReadLevel(reader);
  ASSERT_EQ(server->Stop(SIGKILL), -SIGKILL);
  stop = true;
  for (auto& w : workers) w.join();
  const uint64_t granted = received_total.load();
  ASSERT_GE(granted, 2000u) << "the workers did not get going";

  server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  const Level after = ReadLevel(c);

  // Never above the level seen before the kill plus the refill for the downtime...
  EXPECT_LE(after.budget.tokens(), before.budget.tokens() + RefillBetween(before, after) + kEpsilon);
  // ...and never above what the grants really received leave (the invariant itself: the bucket
  // starts full at the first Sync, after `start`).
  EXPECT_LE(after.budget.tokens(),
            kCapacity - static_cast<double>(granted) +
                kRefillPerSecond * absl::ToDoubleSeconds(after.received - start) + kEpsilon);
  EXPECT_GE(after.budget.granted_total(), granted);
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

struct Damage {
  std::string name;
  // Changes the snapshot file in place.
  void (*apply)(const std::string& path);
  std::string expected;
};

void PrintTo(const Damage& d, std::ostream* os) { *os << d.name; }

class DamagedSnapshotTest : public PersistenceBinaryTest,
                            public ::testing::WithParamInterface<Damage> {};

TEST_P(DamagedSnapshotTest, ServerExitsTwoNamingTheFile) {
  auto server = ServerProcess::Start(dir_.path(), Args());
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("a", 1, "t", 50), &r).ok());
  ASSERT_EQ(server->Stop(SIGTERM), 0);

  const std::string snapshot = data_dir_ + "/state.snapshot";
  ASSERT_TRUE(std::filesystem::exists(snapshot));
  GetParam().apply(snapshot);

  const ExitResult result = RunToExit(dir_.path(), Args());
  EXPECT_EQ(result.code, 2) << result.output;
  EXPECT_THAT(result.output, HasSubstr(snapshot));
  EXPECT_THAT(result.output, HasSubstr(GetParam().expected));
  EXPECT_THAT(result.output, Not(HasSubstr("listening on")));
}

INSTANTIATE_TEST_SUITE_P(
    Table, DamagedSnapshotTest,
    ::testing::Values(
        Damage{"Truncated",
               [](const std::string& path) {
                 std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2);
               },
               "truncated"},
        Damage{"BitFlipped",
               [](const std::string& path) {
                 std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
                 f.seekg(-1, std::ios::end);
                 char last = 0;
                 f.get(last);
                 f.seekp(-1, std::ios::end);
                 f.put(static_cast<char>(last ^ 0x55));
               },
               "damaged"}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace retrybudget::testing
