// Shard ownership against a real 3-node etcd cluster: servers split the shards, a joining server
// takes its share, a leaving one hands its shards over, a paused one stops being sure of its
// lease before etcd can give its shards away and its late writes are refused, and ownership
// survives the death of etcd's leader and, once etcd is back, the loss of all of etcd.
//
// Leases of 2-3 s keep the tests short; every wait is bounded. The bounds asserted are the
// protocol's (takeover within TTL + 2 s, not sure past the last renewal + TTL), not speeds.
#include "cluster/ownership_manager.h"

#include <signal.h>

#include <atomic>
#include <limits>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_keys.h"
#include "cluster/shard_map.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/mutex.h"
#include "tests/support/test_cluster.h"
#include "tests/cluster/wait_for.h"

namespace retrybudget::cluster {
namespace {

using ::retrybudget::testing::TestCluster;
using ::retrybudget::testing::WaitFor;

constexpr char kPrefix[] = "/rb";
constexpr int kShards = 8;
constexpr absl::Duration kTtl = absl::Seconds(2);
// Long enough for any convergence here (a few reconcile rounds, an etcd election).
constexpr absl::Duration kSettle = absl::Seconds(15);

std::set<int> Keys(const std::map<int, int64_t>& owned) {
  std::set<int> keys;
  for (const auto& [shard, token] : owned) keys.insert(shard);
  return keys;
}

class OwnershipManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.etcd_binary = RETRYBUDGET_ETCD_BIN});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd =
        etcd::EtcdClient::Create({.endpoints = cluster_->etcd_endpoints()});
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }

  // A server "id" advertising "id:50051", with its own etcd client (as a separate process has).
  std::unique_ptr<OwnershipManager> StartServer(const std::string& id, absl::Duration ttl = kTtl,
                                                std::function<void(int, int64_t)> released = {}) {
    absl::StatusOr<std::unique_ptr<etcd::EtcdClient>> etcd =
        etcd::EtcdClient::Create({.endpoints = cluster_->etcd_endpoints()});
    EXPECT_TRUE(etcd.ok()) << etcd.status();
    if (!etcd.ok()) return nullptr;
    absl::StatusOr<ShardMap> map = ShardMap::Join(**etcd, kPrefix, kShards);
    EXPECT_TRUE(map.ok()) << map.status();
    if (!map.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<OwnershipManager>> manager =
        OwnershipManager::Start(etcd->get(), *map,
                                {.prefix = kPrefix,
                                 .server_id = id,
                                 .advertise = absl::StrCat(id, ":50051"),
                                 .lease_ttl = ttl,
                                 .before_release = std::move(released)});
    EXPECT_TRUE(manager.ok()) << manager.status();
    if (!manager.ok()) return nullptr;
    clients_.push_back(*std::move(etcd));
    return *std::move(manager);
  }

  // Every shard owned by exactly one of `servers`, each owning `share`.
  static bool Split(const std::vector<OwnershipManager*>& servers, size_t share) {
    std::set<int> all;
    for (OwnershipManager* server : servers) {
      const std::set<int> owned = Keys(server->OwnedShards());
      if (owned.size() != share) return false;
      all.insert(owned.begin(), owned.end());
    }
    return all.size() == kShards;
  }

  std::unique_ptr<TestCluster> cluster_;
  std::unique_ptr<etcd::EtcdClient> etcd_;
  std::vector<std::unique_ptr<etcd::EtcdClient>> clients_;  // outlive the managers (declared
                                                            // before them in each test)
};

TEST(ShardMapTest, Fnv1a64MatchesTheReferenceVectors) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ull);
}

TEST(ShardMapTest, ShardOfIsFnv1a64ModTheNumberOfShards) {
  const ShardMap map(16);
  EXPECT_EQ(map.ShardOf("foobar"), static_cast<int>(0x85944171f73967e8ull % 16));
  for (const char* tenant : {"payments-db", "search", "a", ""}) {
    EXPECT_GE(map.ShardOf(tenant), 0);
    EXPECT_LT(map.ShardOf(tenant), 16);
    EXPECT_EQ(map.ShardOf(tenant), ShardMap(16).ShardOf(tenant));
  }
}

TEST(ShardKeysTest, OwnerKeysRoundTripAndOtherKeysAreNotOwnerKeys) {
  EXPECT_EQ(ShardOwnerKey("/rb", 7), "/rb/owners/0007");
  EXPECT_EQ(ShardOfOwnerKey("/rb", "/rb/owners/0007"), 7);
  EXPECT_EQ(ShardOfOwnerKey("/rb", "/rb/owners/x"), std::nullopt);
  EXPECT_EQ(ShardOfOwnerKey("/rb", "/rb/shards/0007/levels"), std::nullopt);
  EXPECT_EQ(ShardOfOwnerKey("/rb", "/rb/servers/a"), std::nullopt);
  EXPECT_EQ(ShardOfOwnerKey("/rb", "/other/owners/0007"), std::nullopt);
  EXPECT_EQ(ShardStatePrefix("/rb", 7), "/rb/shards/0007/");
}

TEST_F(OwnershipManagerTest, FirstServerStoresTheShardCountAndOthersMustAgree) {
  absl::StatusOr<ShardMap> first = ShardMap::Join(*etcd_, kPrefix, 16);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->shards(), 16);
  EXPECT_EQ(ShardMap::Join(*etcd_, kPrefix, 16)->shards(), 16);
  EXPECT_EQ(ShardMap::Join(*etcd_, kPrefix, 0)->shards(), 16);
  absl::StatusOr<ShardMap> other = ShardMap::Join(*etcd_, kPrefix, 32);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(other.status().message(), ::testing::HasSubstr("16 shards"));
  EXPECT_EQ(ShardMap::Join(*etcd_, "/empty", 0).status().code(), absl::StatusCode::kNotFound);
}

TEST_F(OwnershipManagerTest, AloneAServerOwnsEveryShardWithDistinctTokens) {
  std::unique_ptr<OwnershipManager> a = StartServer("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(WaitFor([&] { return a->OwnedShards().size() == kShards; }, kSettle));
  EXPECT_TRUE(a->SurelyAlive(absl::Now()));
  std::set<int64_t> tokens;
  for (const auto& [shard, token] : a->OwnedShards()) {
    tokens.insert(token);
    EXPECT_EQ(a->FencingToken(shard), token);
    ASSERT_TRUE(a->OwnerOf(shard).has_value());
    EXPECT_EQ(a->OwnerOf(shard)->address, "a:50051");
  }
  EXPECT_EQ(tokens.size(), kShards);
  EXPECT_EQ(a->LiveServers(), std::vector<std::string>{"a"});
}

TEST_F(OwnershipManagerTest, AJoiningServerTakesItsShareAndEachSeesTheOther) {
  // Each shard a sheds is out of its owned set (no more grants) before its state is written.
  OwnershipManager* a_ptr = nullptr;
  std::atomic<int> shed = 0;
  std::atomic<int> shed_while_owned = 0;
  std::unique_ptr<OwnershipManager> a = StartServer("a", kTtl, [&](int shard, int64_t) {
    ++shed;
    if (a_ptr->FencingToken(shard).has_value()) ++shed_while_owned;
  });
  ASSERT_NE(a, nullptr);
  a_ptr = a.get();
  ASSERT_TRUE(WaitFor([&] { return a->OwnedShards().size() == kShards; }, kSettle));
  std::unique_ptr<OwnershipManager> b = StartServer("b");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Split({a.get(), b.get()}, kShards / 2);
      },
      kSettle))
      << a->OwnedShards().size() << " + " << b->OwnedShards().size();
  EXPECT_EQ(shed.load(), kShards / 2);
  EXPECT_EQ(shed_while_owned.load(), 0);
  for (int shard : Keys(b->OwnedShards())) {
    EXPECT_TRUE(WaitFor(
        [&] { return a->OwnerOf(shard).has_value() && a->OwnerOf(shard)->address == "b:50051"; },
        kSettle))
        << shard;
  }
}

TEST_F(OwnershipManagerTest, FencedWritesSucceedForTheOwnerAndFailWithAStaleToken) {
  std::unique_ptr<OwnershipManager> a = StartServer("a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(WaitFor([&] { return a->FencingToken(3).has_value(); }, kSettle));
  const int64_t token = *a->FencingToken(3);
  const std::string state = absl::StrCat(ShardStatePrefix(kPrefix, 3), "levels");
  EXPECT_TRUE(a->FencedTxn(3, token, {etcd::Op::Put(state, "v1")}).ok());
  EXPECT_EQ(etcd_->Get(state)->kvs.at(0).value, "v1");
  EXPECT_EQ(a->FencedTxn(3, token + 1, {etcd::Op::Put(state, "v2")}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(etcd_->Get(state)->kvs.at(0).value, "v1");
}

TEST_F(OwnershipManagerTest, ShutdownHandsEveryShardOverWithinTheTtl) {
  std::vector<int> released;
  Mutex released_mu;
  std::unique_ptr<OwnershipManager> a = StartServer("a", kTtl, [&](int shard, int64_t) {
    MutexLock lock(&released_mu);
    released.push_back(shard);
  });
  std::unique_ptr<OwnershipManager> b = StartServer("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] { return Split({a.get(), b.get()}, kShards / 2); }, kSettle));
  const std::set<int> a_shards = Keys(a->OwnedShards());
  {
    MutexLock lock(&released_mu);
    released.clear();
  }

  const absl::Time stop = absl::Now();
  ASSERT_TRUE(a->Shutdown().ok());
  EXPECT_TRUE(a->OwnedShards().empty());
  EXPECT_FALSE(a->SurelyAlive(absl::Now()));
  {
    MutexLock lock(&released_mu);
    EXPECT_EQ(std::set<int>(released.begin(), released.end()), a_shards);
  }
  ASSERT_TRUE(WaitFor([&] { return b->OwnedShards().size() == kShards; }, kSettle));
  EXPECT_LE(absl::Now() - stop, kTtl + absl::Seconds(2));
  EXPECT_TRUE(WaitFor([&] { return b->LiveServers() == std::vector<std::string>{"b"}; }, kSettle));
}

// SIGSTOP, in process: the paused server's renewals stop. It must stop counting itself alive
// before etcd can let the other server take its shards, and its writes must be refused after.
TEST_F(OwnershipManagerTest, APausedServerIsNotSureBeforeItsShardsMoveAndItsLateWritesFail) {
  std::unique_ptr<OwnershipManager> a = StartServer("a");
  std::unique_ptr<OwnershipManager> b = StartServer("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] { return Split({a.get(), b.get()}, kShards / 2); }, kSettle));
  const std::map<int, int64_t> a_before = a->OwnedShards();
  const int a_shard = a_before.begin()->first;
  const int64_t a_token = a_before.begin()->second;

  const absl::Time paused = absl::Now();
  a->SetPausedForTesting(true);
  const absl::Time sure_until = a->SurelyAliveUntil();
  EXPECT_LE(sure_until, paused + kTtl - a->options().margin);

  // The first moment b owns one of a's shards.
  absl::Time taken = absl::InfiniteFuture();
  ASSERT_TRUE(WaitFor(
      [&] {
        const std::map<int, int64_t> owned = b->OwnedShards();
        for (const auto& [shard, token] : a_before) {
          if (owned.count(shard) > 0) {
            taken = absl::Now();
            return true;
          }
        }
        return false;
      },
      kSettle));
  EXPECT_LT(sure_until, taken);
  ::testing::Test::RecordProperty("unsure_before_takeover_ms",
                                  absl::ToInt64Milliseconds(taken - sure_until));
  ::testing::Test::RecordProperty("takeover_ms", absl::ToInt64Milliseconds(taken - paused));
  EXPECT_LE(taken - paused, kTtl + absl::Seconds(2));
  EXPECT_FALSE(a->SurelyAlive(absl::Now()));
  ASSERT_TRUE(WaitFor([&] { return b->OwnedShards().size() == kShards; }, kSettle));

  // a wakes up and writes as the owner it was: refused.
  absl::StatusOr<etcd::TxnResult> late =
      a->FencedTxn(a_shard, a_token,
                   {etcd::Op::Put(absl::StrCat(ShardStatePrefix(kPrefix, a_shard), "x"), "late")});
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition);

  // Then it finds its lease gone, takes a new one and gets its share back with new tokens.
  a->SetPausedForTesting(false);
  ASSERT_TRUE(WaitFor(
      [&] {
        return Split({a.get(), b.get()}, kShards / 2) && a->SurelyAlive(absl::Now());
      },
      kSettle));
  for (const auto& [shard, token] : a->OwnedShards()) {
    const auto before = a_before.find(shard);
    if (before != a_before.end()) {
      EXPECT_NE(token, before->second) << shard;
    }
  }
}

// A real SIGSTOP of a real process that owns shards and grants from them, for twice its TTL.
// Two probe processes (ownership_probe.cc) own and grant; the test reads etcd. The other one
// takes the stopped one's shards within TTL + 2 s, and no grant of the stopped owner lands
// between the takeover and the moment it owns the shard again (if it does).
TEST_F(OwnershipManagerTest, ASigstoppedOwnerGrantsNothingAfterItsShardsMove) {
  auto spawn = [&](const std::string& id) {
    absl::StatusOr<std::unique_ptr<Subprocess>> probe =
        Subprocess::Spawn({RETRYBUDGET_OWNERSHIP_PROBE, cluster_->etcd_endpoints(), kPrefix, id,
                           absl::StrCat(absl::ToInt64Seconds(kTtl)), absl::StrCat(kShards)},
                          {.pipe_stdout = true});
    EXPECT_TRUE(probe.ok()) << probe.status();
    return probe.ok() ? *std::move(probe) : nullptr;
  };
  // shard -> (owner id, token), from etcd.
  auto owners = [&] {
    std::map<int, std::pair<std::string, int64_t>> result;
    absl::StatusOr<etcd::RangeResult> range = etcd_->GetPrefix(OwnersPrefix(kPrefix));
    if (!range.ok()) return result;
    for (const etcd::KeyValue& kv : range->kvs) {
      std::optional<int> shard = ShardOfOwnerKey(kPrefix, kv.key);
      if (shard.has_value()) result[*shard] = {kv.value, kv.create_revision};
    }
    return result;
  };
  auto count = [&](const std::string& id) {
    int n = 0;
    for (const auto& [shard, owner] : owners()) n += owner.first == id ? 1 : 0;
    return n;
  };
  std::unique_ptr<Subprocess> a = spawn("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->ReadLine(absl::Now() + kSettle).value_or("?"), "ready");
  std::unique_ptr<Subprocess> b = spawn("b");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(
      WaitFor([&] { return count("a") == kShards / 2 && count("b") == kShards / 2; }, kSettle));
  std::set<int> a_shards;
  for (const auto& [shard, owner] : owners()) {
    if (owner.first == "a") a_shards.insert(shard);
  }

  const absl::Time stopped = absl::Now();
  a->Signal(SIGSTOP);
  ASSERT_TRUE(WaitFor([&] { return count("b") == kShards; }, kSettle));
  ::testing::Test::RecordProperty("takeover_ms", absl::ToInt64Milliseconds(absl::Now() - stopped));
  EXPECT_LE(absl::Now() - stopped, kTtl + absl::Seconds(2));
  std::map<int, int64_t> takeover;  // b's tokens for a's former shards
  for (const auto& [shard, owner] : owners()) {
    if (a_shards.count(shard) > 0) takeover[shard] = owner.second;
  }
  std::this_thread::sleep_for(absl::ToChronoNanoseconds(stopped + 2 * kTtl - absl::Now()));
  a->Signal(SIGCONT);

  // a finds its lease gone, registers anew and gets its share back.
  ASSERT_TRUE(
      WaitFor([&] { return count("a") == kShards / 2 && count("b") == kShards / 2; }, kSettle));
  const std::map<int, std::pair<std::string, int64_t>> final_owners = owners();

  // Every grant recorded since the first takeover.
  struct Grant {
    int shard;
    std::string value;
    int64_t revision;
  };
  std::vector<Grant> grants;
  Mutex grants_mu;
  int64_t seen = 0;
  int64_t first = std::numeric_limits<int64_t>::max();
  for (const auto& [shard, token] : takeover) first = std::min(first, token);
  absl::StatusOr<std::unique_ptr<etcd::Watch>> watch = etcd_->WatchPrefix(
      absl::StrCat(kPrefix, "/shards/"), first, [&](const etcd::WatchBatch& batch) {
        MutexLock lock(&grants_mu);
        for (const etcd::WatchEvent& event : batch.events) {
          for (int shard = 0; shard < kShards; ++shard) {
            if (event.kv.key == absl::StrCat(ShardStatePrefix(kPrefix, shard), "grant")) {
              grants.push_back({shard, event.kv.value, event.kv.mod_revision});
            }
          }
          seen = std::max(seen, event.kv.mod_revision);
        }
      });
  ASSERT_TRUE(watch.ok());
  const int64_t upto = etcd_->Get("/nothing")->revision;
  ASSERT_TRUE(WaitFor(
      [&] {
        MutexLock lock(&grants_mu);
        return seen >= upto;
      },
      kSettle));
  watch->reset();
  a->Stop(SIGKILL, absl::Seconds(5)).IgnoreError();
  b->Stop(SIGKILL, absl::Seconds(5)).IgnoreError();

  int in_window = 0;
  for (const auto& [shard, taken] : takeover) {
    const auto owner = final_owners.find(shard);
    const int64_t regained = owner != final_owners.end() && owner->second.first == "a"
                                 ? owner->second.second
                                 : std::numeric_limits<int64_t>::max();
    for (const Grant& grant : grants) {
      if (grant.shard != shard || grant.revision <= taken || grant.revision >= regained) continue;
      ++in_window;
      EXPECT_EQ(grant.value.rfind("a ", 0), std::string::npos)
          << "shard " << shard << ": a granted at revision " << grant.revision
          << " after b took it over at " << taken;
    }
  }
  EXPECT_GT(in_window, 0);  // b's grants: the window was watched
}

TEST_F(OwnershipManagerTest, OwnershipSurvivesTheDeathOfEtcdsLeader) {
  // A longer lease: an election may keep renewals from being answered for about a second.
  std::unique_ptr<OwnershipManager> a = StartServer("a", absl::Seconds(3));
  std::unique_ptr<OwnershipManager> b = StartServer("b", absl::Seconds(3));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] { return Split({a.get(), b.get()}, kShards / 2); }, kSettle));
  const std::map<int, int64_t> a_before = a->OwnedShards();
  const std::map<int, int64_t> b_before = b->OwnedShards();

  absl::StatusOr<int> killed = cluster_->KillEtcdLeader();
  ASSERT_TRUE(killed.ok()) << killed.status();
  ASSERT_TRUE(cluster_->WaitForEtcdLeader(kSettle).ok());
  // Renewals go on through the two live members: both stay sure, with the same shards.
  const absl::Time after = absl::Now() + absl::Seconds(3);
  ASSERT_TRUE(WaitFor(
      [&] { return a->SurelyAliveUntil() > after && b->SurelyAliveUntil() > after; }, kSettle));
  EXPECT_EQ(a->OwnedShards(), a_before);
  EXPECT_EQ(b->OwnedShards(), b_before);
  const int shard = a_before.begin()->first;
  EXPECT_TRUE(
      a->FencedTxn(shard, a_before.begin()->second,
                   {etcd::Op::Put(absl::StrCat(ShardStatePrefix(kPrefix, shard), "x"), "1")})
          .ok());
}

// The member every client starts on hangs (SIGSTOP): calls time out there and move on, and
// ownership goes on through the other two.
TEST_F(OwnershipManagerTest, OwnershipSurvivesAHungEtcdMember) {
  std::unique_ptr<OwnershipManager> a = StartServer("a", absl::Seconds(3));
  std::unique_ptr<OwnershipManager> b = StartServer("b", absl::Seconds(3));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] { return Split({a.get(), b.get()}, kShards / 2); }, kSettle));
  const std::map<int, int64_t> a_before = a->OwnedShards();
  const std::map<int, int64_t> b_before = b->OwnedShards();

  ASSERT_TRUE(cluster_->PauseEtcdNode(0).ok());
  const absl::Time after = absl::Now() + absl::Seconds(4);
  EXPECT_TRUE(WaitFor(
      [&] { return a->SurelyAliveUntil() > after && b->SurelyAliveUntil() > after; }, kSettle));
  EXPECT_EQ(a->OwnedShards(), a_before);
  EXPECT_EQ(b->OwnedShards(), b_before);
  const int shard = b_before.begin()->first;
  EXPECT_TRUE(
      b->FencedTxn(shard, b_before.begin()->second,
                   {etcd::Op::Put(absl::StrCat(ShardStatePrefix(kPrefix, shard), "x"), "1")})
          .ok());
  ASSERT_TRUE(cluster_->ResumeEtcdNode(0).ok());
}

TEST_F(OwnershipManagerTest, WithEtcdGoneAServerIsNotSureWithinTheTtlAndRecoversWhenItReturns) {
  std::unique_ptr<OwnershipManager> a = StartServer("a");
  std::unique_ptr<OwnershipManager> b = StartServer("b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] { return Split({a.get(), b.get()}, kShards / 2); }, kSettle));

  ASSERT_TRUE(cluster_->StopAllEtcd().ok());
  const absl::Time stopped = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return !a->SurelyAlive(absl::Now()) && !b->SurelyAlive(absl::Now()); },
                      kTtl + absl::Seconds(1)));
  // No renewal sent once etcd was gone was answered: sure at most until the stop + TTL - margin.
  EXPECT_LE(a->SurelyAliveUntil(), stopped + kTtl - a->options().margin);
  EXPECT_LE(b->SurelyAliveUntil(), stopped + kTtl - b->options().margin);

  ASSERT_TRUE(cluster_->StartAllEtcd().ok());
  EXPECT_TRUE(WaitFor(
      [&] {
        return Split({a.get(), b.get()}, kShards / 2) && a->SurelyAlive(absl::Now()) &&
               b->SurelyAlive(absl::Now());
      },
      kSettle))
      << a->OwnedShards().size() << " + " << b->OwnedShards().size() << "; " << a->last_error()
      << "; " << b->last_error() << "; sure until " << a->SurelyAliveUntil() << ", "
      << b->SurelyAliveUntil() << "; running " << cluster_->etcd_running(0)
      << cluster_->etcd_running(1) << cluster_->etcd_running(2) << "\n"
      << cluster_->EtcdLogTail(0) << "\n"
      << cluster_->EtcdLogTail(1) << "\n"
      << cluster_->EtcdLogTail(2);
}

}  // namespace
}  // namespace retrybudget::cluster
