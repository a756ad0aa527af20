// The durable store and recovery: a clean restart is exact, a crash never creates tokens, and
// damaged files are refused. Real files in a temporary directory; a fake clock.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/budget_core.h"
#include "server/durable_store.h"
#include "server/snapshotter.h"

namespace retrybudget {
namespace {

using ::testing::HasSubstr;

// The journal's system calls, with failures on demand: the next write writes only half of its
// bytes and then fails, or the next fdatasync fails (after the data was written).
class FaultyIo : public JournalIo {
 public:
  ssize_t Write(int fd, const char* data, size_t size) override {
    if (fail_write_) {
      fail_write_ = false;
      const ssize_t half = JournalIo::Write(fd, data, size / 2);
      (void)half;
      errno = EIO;
      return -1;
    }
    return JournalIo::Write(fd, data, size);
  }
  int DataSync(int fd) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (stall_) {
        ++stalled_syncs_;
        changed_.notify_all();
        changed_.wait(lock, [this] { return !stall_; });
      }
    }
    if (fail_sync_) {
      fail_sync_ = false;
      errno = EIO;
      return -1;
    }
    return JournalIo::DataSync(fd);
  }
  // Failures are armed from the thread that then makes the store write (the store thread runs
  // only after it was asked to).
  void FailNextWrite() { fail_write_ = true; }
  void FailNextSync() { fail_sync_ = true; }

  // A slow disk: from now on every fdatasync waits until Resume().
  void Stall() {
    std::lock_guard<std::mutex> lock(mu_);
    stall_ = true;
  }
  void Resume() {
    std::lock_guard<std::mutex> lock(mu_);
    stall_ = false;
    changed_.notify_all();
  }
  // Waits until an fdatasync is stalled.
  void WaitForStalledSync() {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [this] { return stalled_syncs_ > 0; });
  }
  bool StalledSyncStillWaiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return stall_ && stalled_syncs_ > 0;
  }

 private:
  std::atomic<bool> fail_write_{false};
  std::atomic<bool> fail_sync_{false};
  std::mutex mu_;
  std::condition_variable changed_;
  bool stall_ = false;
  int stalled_syncs_ = 0;
};

int CountJournals(const std::string& dir) {
  int journals = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    journals += e.path().filename().string().rfind("journal.", 0) == 0 ? 1 : 0;
  }
  return journals;
}

class PersistenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/persistence_test_" + std::to_string(::getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A server process: store + core + snapshotter over dir_. Returns false if recovery failed.
  absl::Status Boot(double success_credit = 0) {
    snapshotter_.reset();
    core_.reset();
    store_.reset();
    auto store = DurableStore::Open(dir_, {.io = &io_});
    if (!store.ok()) return store.status();
    store_ = std::move(*store);
    CoreOptions options;
    options.clock = &clock_;
    auto* p = options.policy.mutable_default_policy();
    p->set_capacity(100);
    p->set_refill_per_second(1);
    p->set_success_credit(success_credit);
    options.store = store_.get();
    core_ = std::move(*BudgetCore::Create(options));
    auto snapshotter = Snapshotter::Start(core_.get(), store_.get(), absl::Hours(1));
    if (!snapshotter.ok()) return snapshotter.status();
    snapshotter_ = std::move(*snapshotter);
    return absl::OkStatus();
  }

  // kill -9: nothing more is written; the objects are dropped without Stop().
  void Crash() {
    snapshotter_.release();  // NOLINT: a crashed process runs no destructor
    core_.reset();
    store_.reset();
  }

  // One Sync of tenant `tenant`; returns the grant. Does not wait for the store.
  uint64_t SyncTenant(const std::string& tenant, const std::string& instance, uint64_t seq,
                      uint64_t want, uint64_t received = 0, uint64_t returned = 0,
                      uint64_t spent = 0, bool final = false) {
    v1::SyncRequest r;
    r.set_instance_id(instance);
    r.set_seq(seq);
    r.set_final(final);
    auto* t = r.add_tenants();
    t->set_tenant(tenant);
    t->set_want(want);
    t->set_tokens_received(received);
    t->set_tokens_returned(returned);
    t->set_retries_spent(spent);
    auto resp = core_->Sync(r);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->tenants(0).granted() : 0;
  }

  // A Sync of tenant "t", then a wait until the reservation it may have asked for is on disk
  // (so the next grant does not depend on how fast the store thread is).
  uint64_t Grant(const std::string& instance, uint64_t seq, uint64_t want, uint64_t received = 0,
                 uint64_t returned = 0, uint64_t spent = 0) {
    const uint64_t granted = SyncTenant("t", instance, seq, want, received, returned, spent);
    store_->WaitIdle();
    return granted;
  }

  // A grant never exceeds the limit already on disk. A new tenant starts with a block of
  // capacity/8 = 12 on disk, so a first want above that is cut, and the reservation for it is
  // made then. This makes the tenant and a reservation covering a grant of `want`, from an
  // instance that gives back what it got at once and leaves, holding nothing.
  void Prime(uint64_t want, const std::string& tenant = "t") {
    const uint64_t got = SyncTenant(tenant, "primer-" + tenant, 1, want);
    EXPECT_EQ(got, std::min<uint64_t>(want, 12));
    store_->WaitIdle();
    SyncTenant(tenant, "primer-" + tenant, 2, 0, got, got, 0, /*final=*/true);
    store_->WaitIdle();
  }

  double Tokens() { return core_->GetBudget("t")->tokens(); }

  static v1::SyncRequest Request(const std::string& instance, uint64_t seq, uint64_t want) {
    v1::SyncRequest r;
    r.set_instance_id(instance);
    r.set_seq(seq);
    auto* t = r.add_tenants();
    t->set_tenant("t");
    t->set_want(want);
    return r;
  }

  std::string dir_;
  FaultyIo io_;
  FakeClock clock_;
  std::unique_ptr<DurableStore> store_;
  std::unique_ptr<BudgetCore> core_;
  std::unique_ptr<Snapshotter> snapshotter_;
};

TEST_F(PersistenceTest, CleanRestartRestoresExactLevelsRefilledForTheDowntime) {
  ASSERT_TRUE(Boot().ok());
  Prime(30);
  EXPECT_EQ(Grant("a", 1, 30), 30u);
  const uint64_t granted_before = core_->GetBudget("t")->granted_total();
  ASSERT_TRUE(snapshotter_->Stop().ok());
  clock_.Advance(absl::Seconds(7));  // down for 7 s at 1 token/s
  ASSERT_TRUE(Boot().ok());
  EXPECT_DOUBLE_EQ(Tokens(), 77);
  EXPECT_EQ(core_->GetBudget("t")->granted_total(), granted_before);
  // The instance's history survived too: returning its tokens is credited exactly once.
  Grant("a", 2, 0, /*received=*/30, /*returned=*/30);
  EXPECT_DOUBLE_EQ(Tokens(), 100);
}

// An instance's record kept for a budget deleted before a clean restart stays the old budget's:
// the tokens the instance returns after the restart were that budget's grants and must not
// fill the one created again under the same name (as without a restart,
// BudgetCoreTest.TokensOfADeletedBudgetDoNotFillItsSuccessor).
TEST_F(PersistenceTest, CleanRestartKeepsADeletedBudgetsTokensOutOfItsSuccessor) {
  ASSERT_TRUE(Boot().ok());
  Prime(30);
  EXPECT_EQ(Grant("a", 1, 30), 30u);
  ASSERT_TRUE(core_->DeleteBudget("t").ok());
  ASSERT_TRUE(snapshotter_->Stop().ok());
  ASSERT_TRUE(Boot().ok());
  // A new "t", at its initial 100, of which "b" takes its first block.
  EXPECT_EQ(Grant("b", 1, 30), 12u);
  EXPECT_DOUBLE_EQ(Tokens(), 88);
  // "a" gives back the 30 the deleted budget granted it: a baseline for the new one.
  Grant("a", 2, 0, /*received=*/30, /*returned=*/30);
  EXPECT_DOUBLE_EQ(Tokens(), 88);
  // From there on its history is the new budget's: what it gets now and returns is credited.
  EXPECT_EQ(Grant("a", 3, 5, /*received=*/30, /*returned=*/30), 5u);
  EXPECT_DOUBLE_EQ(Tokens(), 83);
  Grant("a", 4, 0, /*received=*/35, /*returned=*/35);
  EXPECT_DOUBLE_EQ(Tokens(), 88);
}

TEST_F(PersistenceTest, CleanRestartReplaysTheLastResponseToARetriedSync) {
  ASSERT_TRUE(Boot().ok());
  Prime(10);
  EXPECT_EQ(Grant("a", 1, 10), 10u);
  ASSERT_TRUE(snapshotter_->Stop().ok());
  ASSERT_TRUE(Boot().ok());
  EXPECT_EQ(Grant("a", 1, 10), 10u);  // the same response again, not a new grant
  EXPECT_DOUBLE_EQ(Tokens(), 90);
}

TEST_F(PersistenceTest, CleanRestartKeepsTombstonesAndTheirOwners) {
  ASSERT_TRUE(Boot().ok());
  EXPECT_EQ(Grant("a", 1, 10), 10u);
  v1::SyncRequest last;
  last.set_instance_id("a");
  last.set_seq(2);
  last.set_final(true);
  auto* t = last.add_tenants();
  t->set_tenant("t");
  t->set_tokens_received(10);
  t->set_tokens_returned(10);
  ASSERT_TRUE(core_->Sync(last).ok());
  ASSERT_TRUE(core_->Sync(Request("owned", 1, 0), "credential:alpha").ok());
  ASSERT_TRUE(snapshotter_->Stop().ok());
  ASSERT_TRUE(Boot().ok());
  EXPECT_EQ(core_->tombstone_count(), 1u);
  const double level = Tokens();
  auto resend = core_->Sync(last);  // a delayed duplicate of the final request
  ASSERT_TRUE(resend.ok());
  EXPECT_TRUE(resend->stale());
  EXPECT_DOUBLE_EQ(Tokens(), level);
  EXPECT_EQ(core_->Sync(Request("owned", 2, 0), "credential:beta").status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST_F(PersistenceTest, CrashNeverCreatesTokens) {
  ASSERT_TRUE(Boot().ok());
  Prime(11);
  uint64_t granted = 0;
  uint64_t received = 0;
  for (int seq = 1; seq <= 9; ++seq) {
    const uint64_t g = Grant("a", seq, 11, received, 0, received);
    granted += g;
    received += g;
  }
  EXPECT_EQ(granted, 99u);
  Crash();
  ASSERT_TRUE(Boot().ok());
  // Everything granted before the crash stays spent: at most 1 token (what was never granted)
  // is left, never the 100 of a fresh bucket.
  EXPECT_LE(Tokens(), 1.0);
  // A fresh instance after the restart gets nothing beyond that.
  EXPECT_LE(Grant("b", 1, 50), 1u);
}

TEST_F(PersistenceTest, CrashForfeitsAtMostTheUnusedReservation) {
  ASSERT_TRUE(Boot().ok());
  Prime(5);
  // primed: the primer took 5 of a first block of 12, asking for 5 + 5 + 12 = 22; it gave its 5
  // back, and "a" takes 5: 10 granted, limit 22.
  EXPECT_EQ(Grant("a", 1, 5), 5u);
  Crash();
  ASSERT_TRUE(Boot().ok());
  // The tenant is younger than the last snapshot, so the journal is all there is: the whole
  // limit (22) is taken as granted, the primer's return included. Never more, never less.
  EXPECT_DOUBLE_EQ(Tokens(), 100 - 22);
}

TEST_F(PersistenceTest, CrashKeepsTheCreditJournaledWithTheLastReservation) {
  ASSERT_TRUE(Boot(/*success_credit=*/1).ok());
  Prime(11);  // the primer returns its 11: 11 tokens credited back
  uint64_t received = 0;
  for (int seq = 1; seq <= 9; ++seq) received += Grant("a", seq, 11, received, 0, received);
  EXPECT_EQ(received, 99u);
  // 60 successes earn 60 tokens, and the grant that follows asks for a reservation, which
  // carries the credit so far (11 + 60).
  v1::SyncRequest r = Request("a", 10, 30);
  r.mutable_tenants(0)->set_successes(60);
  r.mutable_tenants(0)->set_tokens_received(received);
  r.mutable_tenants(0)->set_retries_spent(received);
  ASSERT_TRUE(core_->Sync(r).ok());
  store_->WaitIdle();
  const double before = Tokens();
  Crash();
  uint64_t limit = 0;
  double credited = 0;
  {
    auto journal = DurableStore::Open(dir_);
    ASSERT_TRUE(journal.ok());
    auto recovered = (*journal)->Load();
    ASSERT_TRUE(recovered.ok()) << recovered.status();
    limit = recovered->reservations.at("t");
    credited = recovered->credited.at("t");
  }
  EXPECT_DOUBLE_EQ(credited, 11 + 60);
  ASSERT_TRUE(Boot(1).ok());
  // The tenant is younger than the snapshot: initial - every token reserved + every token
  // credited before the last reservation. Never more than the level before the crash (the
  // reservation ahead is forfeited), and the credit is not lost (without it: 100 - limit).
  EXPECT_DOUBLE_EQ(Tokens(), 100 - static_cast<double>(limit) + credited);
  EXPECT_LE(Tokens(), before);
}

TEST_F(PersistenceTest, BurstOutOfAFullBucketReservesNoSecondBurst) {
  ASSERT_TRUE(Boot().ok());
  Prime(90);
  // The primer got 12 of 90 (cut), asking for 12 + 88 (what the bucket still held) + a block
  // of 12 = 112; it gave its 12 back. "a" takes 90 of the 100: 10 are left, so it asks for
  // 12 + 90 + 10 + 12 = 124, not for a second 90 the bucket could never give.
  EXPECT_EQ(Grant("a", 1, 90), 90u);
  Crash();
  ASSERT_TRUE(Boot().ok());
  // After a crash (or, in cluster mode, a takeover) every reserved token counts as granted: 24
  // in debt, not 104; the 12 the primer gave back before "a"'s reservation was asked are
  // journaled with it and come back: the tenant starts 12 in debt.
  EXPECT_DOUBLE_EQ(Tokens(), 100 - 124 + 12);
}

TEST_F(PersistenceTest, CrashedInstancesComeBackAsABaseline) {
  ASSERT_TRUE(Boot().ok());
  Prime(20);
  EXPECT_EQ(Grant("a", 1, 20), 20u);
  Crash();
  ASSERT_TRUE(Boot().ok());
  const double level = Tokens();
  // The instance returns all 20 tokens; its history was lost with the crash, so nothing is
  // credited (the safe direction), and the request is not refused either.
  Grant("a", 2, 0, /*received=*/20, /*returned=*/20);
  EXPECT_DOUBLE_EQ(Tokens(), level);
}

TEST_F(PersistenceTest, CrashAfterTenantCreatedSinceTheSnapshotKeepsItsDebt) {
  ASSERT_TRUE(Boot().ok());  // first snapshot: no tenant yet
  Prime(60);
  EXPECT_EQ(Grant("a", 1, 60), 60u);
  Crash();
  ASSERT_TRUE(Boot().ok());
  EXPECT_LE(Tokens(), 40.0);
}

TEST_F(PersistenceTest, TruncatedSnapshotIsRefused) {
  ASSERT_TRUE(Boot().ok());
  Grant("a", 1, 30);
  ASSERT_TRUE(snapshotter_->Stop().ok());
  const std::string path = dir_ + "/state.snapshot";
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 5);
  absl::Status s = Boot();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("state.snapshot is truncated"));
}

TEST_F(PersistenceTest, CorruptSnapshotIsRefused) {
  ASSERT_TRUE(Boot().ok());
  Grant("a", 1, 30);
  ASSERT_TRUE(snapshotter_->Stop().ok());
  const std::string path = dir_ + "/state.snapshot";
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(20);
  f.put('\x7f');
  f.close();
  absl::Status s = Boot();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("fails its checksum"));
}

TEST_F(PersistenceTest, TornLastJournalRecordIsIgnored) {
  auto store = DurableStore::Open(dir_);
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Load().ok());
  ASSERT_TRUE((*store)->Reserve("t", 10).ok());
  ASSERT_TRUE((*store)->Reserve("t", 20).ok());
  store->reset();
  // Cut the last record in half, as a crash in the middle of an append would.
  std::string journal;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) journal = e.path();
  std::filesystem::resize_file(journal, std::filesystem::file_size(journal) - 3);
  auto reopened = DurableStore::Open(dir_);
  auto recovered = (*reopened)->Load();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->reservations.at("t"), 10u);
}

TEST_F(PersistenceTest, DamagedJournalRecordBeforeTheEndIsRefused) {
  auto store = DurableStore::Open(dir_);
  ASSERT_TRUE((*store)->Load().ok());
  ASSERT_TRUE((*store)->Reserve("t", 10).ok());
  ASSERT_TRUE((*store)->Reserve("t", 20).ok());
  store->reset();
  std::string journal;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) journal = e.path();
  std::fstream f(journal, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(13);  // inside the first record's payload
  f.put('\x55');
  f.close();
  auto recovered = (*DurableStore::Open(dir_))->Load();
  ASSERT_FALSE(recovered.ok());
  EXPECT_EQ(recovered.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(recovered.status().message()), HasSubstr("fails its checksum"));
}

TEST_F(PersistenceTest, FailedWriteLeavesNoTearBeforeTheNextRecord) {
  FaultyIo io;
  auto store = DurableStore::Open(dir_, {.io = &io});
  ASSERT_TRUE((*store)->Load().ok());
  ASSERT_TRUE((*store)->Reserve("t", 10).ok());
  io.FailNextWrite();  // half a record written, then EIO
  EXPECT_FALSE((*store)->Reserve("t", 20).ok());
  ASSERT_TRUE((*store)->Reserve("t", 30).ok());
  store->reset();
  auto recovered = (*DurableStore::Open(dir_))->Load();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->reservations.at("t"), 30u);
}

TEST_F(PersistenceTest, FailedFdatasyncMovesToANewJournal) {
  FaultyIo io;
  auto store = DurableStore::Open(dir_, {.io = &io});
  ASSERT_TRUE((*store)->Load().ok());
  ASSERT_TRUE((*store)->Reserve("t", 10).ok());
  io.FailNextSync();
  EXPECT_FALSE((*store)->Reserve("t", 20).ok());
  ASSERT_TRUE((*store)->Reserve("t", 30).ok());
  // The file whose fdatasync failed is never written again (a retried fdatasync may report
  // success for data that was lost): the next record went to a new journal.
  EXPECT_EQ(CountJournals(dir_), 2);
  store->reset();
  auto recovered = (*DurableStore::Open(dir_))->Load();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->reservations.at("t"), 30u);
}

TEST_F(PersistenceTest, TornRecordAtTheEndOfAnOlderJournalDoesNotStopTheStart) {
  auto store = DurableStore::Open(dir_);
  ASSERT_TRUE((*store)->Load().ok());
  ASSERT_TRUE((*store)->Reserve("t", 10).ok());
  ASSERT_TRUE((*store)->Reserve("t", 20).ok());
  ASSERT_TRUE((*store)->RotateJournal().ok());
  ASSERT_TRUE((*store)->Reserve("u", 5).ok());
  store->reset();
  // The older journal ends in half a record, as after a failed append whose cut never reached
  // the disk.
  const std::string older = dir_ + "/journal.1.log";
  std::filesystem::resize_file(older, std::filesystem::file_size(older) - 3);
  auto recovered = (*DurableStore::Open(dir_))->Load();
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  EXPECT_EQ(recovered->reservations.at("t"), 10u);
  EXPECT_EQ(recovered->reservations.at("u"), 5u);
}

TEST_F(PersistenceTest, FailedReservationCutsTheGrantAndTheRestartCountsWhatWasReserved) {
  ASSERT_TRUE(Boot().ok());
  Prime(5);
  uint64_t granted = Grant("a", 1, 5);  // primed: 12 more on disk after this grant
  EXPECT_EQ(granted, 5u);
  io_.FailNextSync();
  // Needs a limit of 25: the reservation fails, so the grant is cut to what is durable (12).
  const uint64_t cut = Grant("a", 2, 20, 5, 0, 5);
  EXPECT_EQ(cut, 12u);
  granted += cut;
  EXPECT_EQ(core_->store_errors(), 1u);
  // The store works again, in a new journal: the next reservation (a block past 10 more) lands,
  // and the Sync after it is granted in full.
  EXPECT_EQ(Grant("b", 1, 10), 0u);
  granted += Grant("b", 2, 10);
  EXPECT_EQ(granted, 27u);
  Crash();
  ASSERT_TRUE(Boot().ok()) << "a transient disk error must not stop the next start";
  EXPECT_LE(Tokens(), 100.0 - static_cast<double>(granted));
}

TEST_F(PersistenceTest, SlowDiskStallsNoOtherTenantNorItsOwnSyncs) {
  ASSERT_TRUE(Boot().ok());
  Prime(10, "fast");  // "fast" has a durable limit of 10 + 12 ahead
  io_.Stall();
  // "slow" is new: its Sync is answered at once, its grant cut to the durable limit (none yet),
  // and its first reservation waits in an fdatasync that does not return.
  EXPECT_EQ(SyncTenant("slow", "s", 1, 10), 0u);
  io_.WaitForStalledSync();
  // Meanwhile "fast" is granted within its durable limit, on another thread (were a Sync to wait
  // for the disk, the future would not become ready until Resume()).
  auto fast = std::async(std::launch::async, [&] {
    uint64_t granted = 0;
    for (uint64_t seq = 1; seq <= 2; ++seq) {
      granted += SyncTenant("fast", "f", seq, 10, granted, 0, granted);
    }
    return granted;
  });
  ASSERT_EQ(fast.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "a Sync of another tenant waited for the stalled fdatasync";
  EXPECT_EQ(fast.get(), 20u);
  EXPECT_TRUE(io_.StalledSyncStillWaiting());  // the order: both Syncs done during the stall
  // "slow" is not granted beyond what is on disk while its reservation is stalled.
  EXPECT_EQ(SyncTenant("slow", "s", 2, 10), 0u);
  io_.Resume();
  store_->WaitIdle();
  EXPECT_EQ(SyncTenant("slow", "s", 3, 10), 10u);
}

TEST_F(PersistenceTest, GrantCutForADiskWriteAsksTheClientBackAtOnce) {
  ASSERT_TRUE(Boot().ok());
  io_.Stall();
  // A new tenant with a full bucket: its first grant waits for its first reservation. The
  // answer must bring the client back at the shortest hint, not at the dry-bucket pace (which
  // at 1 token/s would keep it denied for 250 ms with 100 tokens in the bucket).
  v1::SyncRequest r;
  r.set_instance_id("i");
  r.set_seq(1);
  auto* t = r.add_tenants();
  t->set_tenant("new");
  t->set_want(10);
  auto resp = core_->Sync(r);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_EQ(resp->tenants(0).granted(), 0u);
  EXPECT_EQ(resp->tenants(0).next_sync_ms(), 10);
  io_.Resume();
  store_->WaitIdle();
  EXPECT_EQ(SyncTenant("new", "i", 2, 10), 10u);
}

TEST_F(PersistenceTest, SnapshotDropsJournalsItCovers) {
  ASSERT_TRUE(Boot().ok());
  Prime(20);
  for (int seq = 1; seq <= 5; ++seq) Grant("a", seq, 20, 20 * (seq - 1), 0, 20 * (seq - 1));
  ASSERT_TRUE(snapshotter_->SnapshotNow(false).ok());
  EXPECT_EQ(CountJournals(dir_), 1);  // only the current, empty one
}

}  // namespace
}  // namespace retrybudget
