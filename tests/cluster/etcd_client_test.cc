// The etcd client against a real 3-node etcd cluster: reads, writes and transactions, leases and
// their keep-alive, prefix watches, and fail-over when the member in use dies.
#include "etcd/etcd_client.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/mutex.h"
#include "tests/support/test_cluster.h"
#include "tests/cluster/wait_for.h"

namespace retrybudget::etcd {
namespace {

using ::retrybudget::testing::TestCluster;
using ::retrybudget::testing::WaitFor;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;

// Collects what a watch delivers.
class Recorder {
 public:
  void Add(const WatchBatch& batch) {
    MutexLock lock(&mu_);
    for (const WatchEvent& event : batch.events) {
      events_.push_back(absl::StrCat(event.type == WatchEvent::Type::kPut ? "put " : "delete ",
                                     event.kv.key, event.type == WatchEvent::Type::kPut ? "=" : "",
                                     event.kv.value));
    }
  }
  std::vector<std::string> events() {
    MutexLock lock(&mu_);
    return events_;
  }
  size_t size() { return events().size(); }

 private:
  Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
        TestCluster::Start({.etcd_binary = RETRYBUDGET_ETCD_BIN});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = cluster->release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client =
        EtcdClient::Create({.endpoints = cluster_->etcd_endpoints()});
    ASSERT_TRUE(client.ok()) << client.status();
    etcd_ = *std::move(client);
    // Each test under its own prefix in the shared cluster.
    prefix_ =
        absl::StrCat("/", ::testing::UnitTest::GetInstance()->current_test_info()->name(), "/");
  }

  std::string Key(absl::string_view name) { return absl::StrCat(prefix_, name); }

  static TestCluster* cluster_;
  std::unique_ptr<EtcdClient> etcd_;
  std::string prefix_;
};

TestCluster* EtcdClientTest::cluster_ = nullptr;

TEST_F(EtcdClientTest, PutThenGetReturnsTheValueAndItsRevisions) {
  absl::StatusOr<int64_t> revision = etcd_->Put(Key("a"), "1");
  ASSERT_TRUE(revision.ok()) << revision.status();
  absl::StatusOr<RangeResult> got = etcd_->Get(Key("a"));
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->kvs.size(), 1u);
  EXPECT_EQ(got->kvs[0].value, "1");
  EXPECT_EQ(got->kvs[0].create_revision, *revision);
  EXPECT_EQ(got->kvs[0].mod_revision, *revision);
  EXPECT_GE(got->revision, *revision);
}

TEST_F(EtcdClientTest, GetOfAMissingKeyIsEmptyNotAnError) {
  absl::StatusOr<RangeResult> got = etcd_->Get(Key("missing"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->kvs, IsEmpty());
}

TEST_F(EtcdClientTest, GetPrefixReturnsOnlyKeysUnderThePrefixSorted) {
  ASSERT_TRUE(etcd_->Put(Key("p/b"), "2").ok());
  ASSERT_TRUE(etcd_->Put(Key("p/a"), "1").ok());
  ASSERT_TRUE(etcd_->Put(Key("q"), "3").ok());
  absl::StatusOr<RangeResult> got = etcd_->GetPrefix(Key("p/"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_THAT(got->kvs,
              ElementsAre(Field(&KeyValue::key, Key("p/a")), Field(&KeyValue::key, Key("p/b"))));
}

TEST_F(EtcdClientTest, DeleteRemovesTheKeyAndCountsIt) {
  ASSERT_TRUE(etcd_->Put(Key("d"), "x").ok());
  EXPECT_EQ(etcd_->Delete(Key("d")).value_or(-1), 1);
  EXPECT_EQ(etcd_->Delete(Key("d")).value_or(-1), 0);
}

TEST_F(EtcdClientTest, TxnOnCreateRevisionZeroCreatesOnlyOnce) {
  const std::string key = Key("owner");
  absl::StatusOr<TxnResult> first =
      etcd_->Txn({Compare::CreateRevisionIs(key, 0)}, {Op::Put(key, "a")}, {Op::Get(key)});
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->succeeded);

  absl::StatusOr<TxnResult> second =
      etcd_->Txn({Compare::CreateRevisionIs(key, 0)}, {Op::Put(key, "b")}, {Op::Get(key)});
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_FALSE(second->succeeded);
  ASSERT_EQ(second->gets.size(), 1u);
  ASSERT_EQ(second->gets[0].size(), 1u);
  EXPECT_EQ(second->gets[0][0].value, "a");
  EXPECT_EQ(second->gets[0][0].create_revision, first->revision);
}

TEST_F(EtcdClientTest, TxnComparesModRevisionAndValue) {
  const std::string key = Key("k");
  absl::StatusOr<int64_t> revision = etcd_->Put(key, "v1");
  ASSERT_TRUE(revision.ok());
  absl::StatusOr<TxnResult> stale =
      etcd_->Txn({Compare::ModRevisionIs(key, *revision - 1)}, {Op::Put(key, "stale")});
  ASSERT_TRUE(stale.ok());
  EXPECT_FALSE(stale->succeeded);
  absl::StatusOr<TxnResult> fresh =
      etcd_->Txn({Compare::ModRevisionIs(key, *revision), Compare::ValueIs(key, "v1")},
                 {Op::Put(key, "v2"), Op::Get(key)});
  ASSERT_TRUE(fresh.ok());
  EXPECT_TRUE(fresh->succeeded);
  ASSERT_EQ(fresh->gets.size(), 1u);
  EXPECT_EQ(fresh->gets[0].at(0).value, "v2");
}

TEST_F(EtcdClientTest, RevokingALeaseDeletesItsKeys) {
  absl::StatusOr<LeaseGrant> lease = etcd_->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  EXPECT_EQ(lease->ttl, absl::Seconds(30));
  ASSERT_TRUE(etcd_->Put(Key("leased"), "x", lease->id).ok());
  EXPECT_EQ(etcd_->Get(Key("leased"))->kvs.at(0).lease, lease->id);

  ASSERT_TRUE(etcd_->RevokeLease(lease->id).ok());
  EXPECT_THAT(etcd_->Get(Key("leased"))->kvs, IsEmpty());
  EXPECT_EQ(etcd_->RevokeLease(lease->id).code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdClientTest, ALeaseNotKeptAliveExpiresWithItsKeys) {
  absl::StatusOr<LeaseGrant> lease = etcd_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(etcd_->Put(Key("leased"), "x", lease->id).ok());
  EXPECT_TRUE(WaitFor([&] { return etcd_->Get(Key("leased"))->kvs.empty(); }, absl::Seconds(10)));
}

TEST_F(EtcdClientTest, KeepAliveHoldsTheLeaseBeyondItsTtlAndRecordsSendTimes) {
  absl::StatusOr<LeaseGrant> lease = etcd_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(etcd_->Put(Key("leased"), "x", lease->id).ok());
  std::atomic<int> answers = 0;
  absl::StatusOr<std::unique_ptr<KeepAlive>> keep = etcd_->StartKeepAlive(
      *lease, absl::Milliseconds(300), [&](const KeepAliveAnswer&) { ++answers; });
  ASSERT_TRUE(keep.ok()) << keep.status();
  EXPECT_EQ((*keep)->last_answer().sent, lease->sent);  // seeded with the grant

  const absl::Time before = absl::Now();
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // longer than the TTL
  EXPECT_THAT(etcd_->Get(Key("leased"))->kvs, ::testing::SizeIs(1));
  const KeepAliveAnswer last = (*keep)->last_answer();
  EXPECT_GT(last.sent, before);
  EXPECT_LE(last.sent, absl::Now());
  EXPECT_EQ(last.ttl, absl::Seconds(2));
  EXPECT_GE(answers.load(), 3);
  EXPECT_FALSE((*keep)->lost());
}

TEST_F(EtcdClientTest, KeepAliveOfARevokedLeaseReportsItLost) {
  absl::StatusOr<LeaseGrant> lease = etcd_->GrantLease(absl::Seconds(5));
  ASSERT_TRUE(lease.ok()) << lease.status();
  absl::StatusOr<std::unique_ptr<KeepAlive>> keep =
      etcd_->StartKeepAlive(*lease, absl::Milliseconds(100));
  ASSERT_TRUE(keep.ok()) << keep.status();
  ASSERT_TRUE(etcd_->RevokeLease(lease->id).ok());
  EXPECT_TRUE(WaitFor([&] { return (*keep)->lost(); }, absl::Seconds(5)));
}

TEST_F(EtcdClientTest, WatchDeliversPutsAndDeletesUnderThePrefixInOrder) {
  Recorder recorder;
  absl::StatusOr<std::unique_ptr<Watch>> watch =
      etcd_->WatchPrefix(Key("w/"), 0, [&](const WatchBatch& b) { recorder.Add(b); });
  ASSERT_TRUE(watch.ok()) << watch.status();
  // The watch is created asynchronously: write until it has seen a first event.
  ASSERT_TRUE(WaitFor(
      [&] {
        etcd_->Put(Key("w/probe"), "p").IgnoreError();
        return recorder.size() > 0;
      },
      absl::Seconds(10)));
  ASSERT_TRUE(etcd_->Put(Key("w/a"), "1").ok());
  ASSERT_TRUE(etcd_->Put(Key("outside"), "x").ok());
  ASSERT_TRUE(etcd_->Delete(Key("w/a")).ok());
  // What came after the probes (the last of which may arrive after the first was seen).
  auto after_probes = [&] {
    std::vector<std::string> events;
    for (const std::string& event : recorder.events()) {
      if (!absl::StrContains(event, "probe")) events.push_back(event);
    }
    return events;
  };
  ASSERT_TRUE(WaitFor([&] { return after_probes().size() >= 2; }, absl::Seconds(10)));
  EXPECT_THAT(after_probes(), ElementsAre(absl::StrCat("put ", Key("w/a"), "=1"),
                                          absl::StrCat("delete ", Key("w/a"))));
}

TEST_F(EtcdClientTest, WatchFromARevisionReplaysWhatCameAfterIt) {
  absl::StatusOr<int64_t> first = etcd_->Put(Key("r/a"), "1");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(etcd_->Put(Key("r/b"), "2").ok());
  Recorder recorder;
  absl::StatusOr<std::unique_ptr<Watch>> watch =
      etcd_->WatchPrefix(Key("r/"), *first, [&](const WatchBatch& b) { recorder.Add(b); });
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE(WaitFor([&] { return recorder.size() >= 2; }, absl::Seconds(10)));
  EXPECT_THAT(recorder.events(), ElementsAre(absl::StrCat("put ", Key("r/a"), "=1"),
                                             absl::StrCat("put ", Key("r/b"), "=2")));
}

TEST(EtcdClientCreateTest, RejectsEndpointsThatAreNotHostPort) {
  EXPECT_EQ(EtcdClient::Create({.endpoints = ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({.endpoints = "127.0.0.1"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create({.endpoints = "127.0.0.1:1,host:x"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EtcdClient::Create({.endpoints = "127.0.0.1:1, [::1]:2"}).ok());
}

TEST(EtcdClientCreateTest, PrefixRangeEndIsThePrefixWithItsLastByteIncremented) {
  EXPECT_EQ(PrefixRangeEnd("/a/"), "/a0");
  EXPECT_EQ(PrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(PrefixRangeEnd(""), std::string(1, '\0'));
}

// The member in use dies: calls go on through another member, and a watch reconnects there
// without losing an event.
TEST(EtcdClientFailoverTest, CallsAndWatchesMoveToALiveMemberWhenTheirsIsKilled) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.etcd_binary = RETRYBUDGET_ETCD_BIN});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Create({.endpoints = (*cluster)->etcd_endpoints()});
  ASSERT_TRUE(etcd.ok());
  Recorder recorder;
  absl::StatusOr<std::unique_ptr<Watch>> watch =
      (*etcd)->WatchPrefix("/f/", 1, [&](const WatchBatch& b) { recorder.Add(b); });
  ASSERT_TRUE(watch.ok());
  ASSERT_TRUE((*etcd)->Put("/f/0", "before").ok());
  ASSERT_TRUE(WaitFor([&] { return recorder.size() == 1; }, absl::Seconds(10)));

  // The client starts on the first endpoint.
  ASSERT_TRUE((*cluster)->KillEtcdNode(0).ok());
  for (int i = 1; i <= 5; ++i) {
    absl::StatusOr<int64_t> put = (*etcd)->Put(absl::StrCat("/f/", i), "after");
    // A put may land in the election that the kill can cause; the next one must not fail.
    if (!put.ok()) {
      ASSERT_TRUE((*cluster)->WaitForEtcdLeader(absl::Seconds(20)).ok());
      ASSERT_TRUE((*etcd)->Put(absl::StrCat("/f/", i), "after").ok());
    }
  }
  EXPECT_TRUE(WaitFor([&] { return recorder.size() >= 6; }, absl::Seconds(10)));
  EXPECT_EQ(recorder.size(), 6u) << ::testing::PrintToString(recorder.events());
}

}  // namespace
}  // namespace retrybudget::etcd

namespace retrybudget::etcd {
namespace {

// Every member gone, then back on the same ports: the client reconnects by itself, without
// waiting out a long reconnect back-off or a re-resolution cool-down.
TEST(EtcdClientFailoverTest, CallsSucceedAgainSoonAfterAllMembersComeBack) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.etcd_binary = RETRYBUDGET_ETCD_BIN});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd =
      EtcdClient::Create({.endpoints = (*cluster)->etcd_endpoints()});
  ASSERT_TRUE(etcd.ok());
  ASSERT_TRUE((*etcd)->Put("/back", "1").ok());
  ASSERT_TRUE((*cluster)->StopAllEtcd().ok());
  // Fail for a while, so that the channels back off as far as they go.
  for (int i = 0; i < 10; ++i) {
    EXPECT_FALSE((*etcd)->Put("/back", "2").ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE((*cluster)->StartAllEtcd().ok());
  const absl::Time back = absl::Now();
  absl::Status last;
  EXPECT_TRUE(WaitFor(
      [&] {
        last = (*etcd)->Put("/back", "3").status();
        return last.ok();
      },
      absl::Seconds(10)))
      << last;
  EXPECT_LE(absl::Now() - back, absl::Seconds(5))
      << "reconnected only after " << absl::Now() - back;
}

}  // namespace
}  // namespace retrybudget::etcd

namespace retrybudget::etcd {
namespace {

// The member in use hangs (SIGSTOP): a call there ends at its deadline, and the calls after it
// go to another member.
TEST(EtcdClientFailoverTest, ACallToAHungMemberEndsAtItsDeadlineAndTheNextGoElsewhere) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.etcd_binary = RETRYBUDGET_ETCD_BIN});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Create(
      {.endpoints = (*cluster)->etcd_endpoints(), .call_timeout = absl::Milliseconds(500)});
  ASSERT_TRUE(etcd.ok());
  ASSERT_TRUE((*etcd)->Put("/hung", "1").ok());
  // The member the client is connected to: usually the first, but a loaded machine's first
  // call may have found it not ready and moved on (the endpoints are the nodes, in order).
  const int in_use = static_cast<int>((*etcd)->endpoint_in_use());
  ASSERT_LT(in_use, (*cluster)->etcd_node_count());

  ASSERT_TRUE((*cluster)->PauseEtcdNode(in_use).ok());
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> stuck = (*etcd)->Put("/hung", "2");
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kDeadlineExceeded) << stuck.status();
  // The deadline, not how long the member stays hung, ends the call (generous slack for a
  // loaded machine; the member stays stopped for the whole test).
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  absl::Status last;
  EXPECT_TRUE(WaitFor(
      [&] {
        last = (*etcd)->Put("/hung", "3").status();
        return last.ok();
      },
      absl::Seconds(10)))
      << last;
  ASSERT_TRUE((*cluster)->ResumeEtcdNode(in_use).ok());
}


// EndCallsBy (a bounded shutdown): with every member hung (SIGSTOP) and a call timeout of 20 s,
// a call in flight ends (CANCELLED) as soon as EndCallsBy is called, and later calls end by its
// deadline, then at once after it.
TEST(EtcdClientFailoverTest, EndCallsByCancelsTheCallsInFlightAndCapsTheNextOnes) {
  absl::StatusOr<std::unique_ptr<TestCluster>> cluster =
      TestCluster::Start({.etcd_binary = RETRYBUDGET_ETCD_BIN});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  absl::StatusOr<std::unique_ptr<EtcdClient>> etcd = EtcdClient::Create(
      {.endpoints = (*cluster)->etcd_endpoints(), .call_timeout = absl::Seconds(20)});
  ASSERT_TRUE(etcd.ok());
  ASSERT_TRUE((*etcd)->Put("/end", "1").ok());
  for (int i = 0; i < (*cluster)->etcd_node_count(); ++i) {
    ASSERT_TRUE((*cluster)->PauseEtcdNode(i).ok());
  }
  absl::Status in_flight;
  absl::Time in_flight_ended;
  std::thread call([&] {
    in_flight = (*etcd)->Put("/end", "2").status();
    in_flight_ended = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(300));  // the call is waiting on the hung member
  const absl::Time ended_by = absl::Now();
  (*etcd)->EndCallsBy(ended_by + absl::Seconds(1));
  call.join();
  EXPECT_EQ(in_flight.code(), absl::StatusCode::kCancelled) << in_flight;
  // Generous bounds for a loaded machine; without EndCallsBy these take 20 s each.
  EXPECT_LT(in_flight_ended - ended_by, absl::Seconds(5));
  const absl::Status capped = (*etcd)->Put("/end", "3").status();
  EXPECT_EQ(capped.code(), absl::StatusCode::kDeadlineExceeded) << capped;
  EXPECT_LT(absl::Now() - ended_by, absl::Seconds(6));
  const absl::Time after = absl::Now();
  const absl::Status past = (*etcd)->Put("/end", "4").status();
  EXPECT_EQ(past.code(), absl::StatusCode::kDeadlineExceeded) << past;
  EXPECT_LT(absl::Now() - after, absl::Seconds(5));
  for (int i = 0; i < (*cluster)->etcd_node_count(); ++i) {
    ASSERT_TRUE((*cluster)->ResumeEtcdNode(i).ok());
  }
}

}  // namespace
}  // namespace retrybudget::etcd
