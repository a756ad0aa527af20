// PutPolicyRequest.update_mask over the wire on one server: a masked put changes only the fields
// it names, an unknown path or an invalid merge changes nothing, and concurrent masked and whole
// puts never lose each other's fields.
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

ServerConnection Connect(TestServer& server) {
  return ServerConnection::Create(server.address(), grpc::InsecureChannelCredentials());
}

// PutPolicy of `tenant` with `policy` and an update_mask of `paths`, on `server`.
grpc::Status MaskedPut(ServerConnection& c, const std::string& tenant,
                       const v1::BudgetPolicy& policy, const std::vector<std::string>& paths,
                       v1::BudgetStatus* budget = nullptr) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PutPolicyRequest request;
  request.set_tenant(tenant);
  *request.mutable_policy() = policy;
  for (const std::string& p : paths) request.mutable_update_mask()->add_paths(p);
  v1::PutPolicyResponse response;
  grpc::Status status = c.admin->PutPolicy(&context, request, &response);
  if (budget != nullptr) *budget = response.budget();
  return status;
}

TEST(PolicyMaskTest, AMaskedPutChangesOnlyTheFieldsItNames) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  ServerConnection c = Connect(*s);
  ASSERT_TRUE(s->PutPolicy("t",
                           Parse<v1::BudgetPolicy>("capacity: 40 refill_per_second: 2 "
                                                   "success_credit: 0.5 initial_tokens: 7 "
                                                   "mode: MODE_SHADOW"),
                           nullptr)
                  .ok());
  v1::BudgetStatus b;
  // Only capacity: the refill in the request is not named, so not taken.
  grpc::Status st = MaskedPut(
      c, "t", Parse<v1::BudgetPolicy>("capacity: 60 refill_per_second: 9"), {"capacity"}, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(b.policy().capacity(), 60);
  EXPECT_EQ(b.policy().refill_per_second(), 2);
  EXPECT_EQ(b.policy().success_credit(), 0.5);
  EXPECT_EQ(b.policy().initial_tokens(), 7);
  EXPECT_EQ(b.policy().mode(), v1::MODE_SHADOW);
  EXPECT_DOUBLE_EQ(b.tokens(), 7);  // the level is kept

  // A named field the request leaves unset takes its default.
  ASSERT_TRUE(MaskedPut(c, "t", {}, {"mode", "refill_per_second"}, &b).ok());
  EXPECT_EQ(b.policy().mode(), v1::MODE_ENFORCE);
  EXPECT_EQ(b.policy().refill_per_second(), 1);
  EXPECT_EQ(b.policy().capacity(), 60);
  ASSERT_TRUE(s->GetBudget("t", &b).ok());
  EXPECT_EQ(b.policy().capacity(), 60);
  EXPECT_EQ(b.policy().success_credit(), 0.5);
  EXPECT_TRUE(b.explicit_policy());
}

TEST(PolicyMaskTest, AFieldDerivedFromAnotherFollowsIt) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  ServerConnection c = Connect(*s);
  // initial_tokens unset: = capacity (100); a masked capacity of 50 is not refused for it.
  ASSERT_TRUE(s->PutPolicy("t", Parse<v1::BudgetPolicy>("capacity: 100"), nullptr).ok());
  v1::BudgetStatus b;
  grpc::Status st = MaskedPut(c, "t", Parse<v1::BudgetPolicy>("capacity: 50"), {"capacity"}, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(b.policy().capacity(), 50);
  EXPECT_EQ(b.policy().initial_tokens(), 50);
  // A windowed policy's lease (ttl / 10 when unset) follows its ttl.
  ASSERT_TRUE(s->PutPolicy("w", Parse<v1::BudgetPolicy>("ttl_ms: 10000"), nullptr).ok());
  st = MaskedPut(c, "w", Parse<v1::BudgetPolicy>("ttl_ms: 20000"), {"ttl_ms"}, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(b.policy().ttl_ms(), 20000);
  EXPECT_EQ(b.policy().lease_ttl_ms(), 2000);
}

TEST(PolicyMaskTest, AnUnknownPathIsRefusedNamingItAndChangesNothing) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  ServerConnection c = Connect(*s);
  ASSERT_TRUE(
      s->PutPolicy("t", Parse<v1::BudgetPolicy>("capacity: 40 mode: MODE_SHADOW"), nullptr).ok());
  for (const char* path : {"capcity", "policy.capacity", ""}) {
    const grpc::Status st =
        MaskedPut(c, "t", Parse<v1::BudgetPolicy>("capacity: 5"), {"mode", path});
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << path;
    EXPECT_THAT(st.error_message(), HasSubstr("update_mask"));
    EXPECT_THAT(st.error_message(), HasSubstr(absl::StrCat("\"", path, "\"")));
  }
  // Nor is a tenant created by a refused put.
  EXPECT_EQ(MaskedPut(c, "new", {}, {"nope"}).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  v1::BudgetStatus b;
  EXPECT_EQ(s->GetBudget("new", &b).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(s->GetBudget("t", &b).ok());
  EXPECT_EQ(b.policy().capacity(), 40);
  EXPECT_EQ(b.policy().mode(), v1::MODE_SHADOW);
}

TEST(PolicyMaskTest, AMergeOfBothShapesIsRefusedAndAMaskNamingTheOldShapeSwitches) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  ServerConnection c = Connect(*s);
  ASSERT_TRUE(s->PutPolicy("t", Parse<v1::BudgetPolicy>("capacity: 40"), nullptr).ok());
  grpc::Status st =
      MaskedPut(c, "t", Parse<v1::BudgetPolicy>("retry_ratio: 0.2"), {"retry_ratio"});
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(st.error_message(), HasSubstr("update_mask"));
  EXPECT_THAT(st.error_message(), HasSubstr("capacity"));
  EXPECT_THAT(st.error_message(), HasSubstr("retry_ratio"));
  v1::BudgetStatus b;
  ASSERT_TRUE(s->GetBudget("t", &b).ok());
  EXPECT_EQ(b.policy().capacity(), 40);
  EXPECT_FALSE(b.policy().has_retry_ratio());

  st = MaskedPut(c, "t", Parse<v1::BudgetPolicy>("retry_ratio: 0.2"),
                 {"retry_ratio", "capacity", "refill_per_second", "success_credit"}, &b);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(b.policy().retry_ratio(), 0.2);
  EXPECT_FALSE(b.policy().has_capacity());
}

TEST(PolicyMaskTest, ATenantWithoutAnExplicitPolicyMergesIntoThePolicyFiles) {
  TestServerOptions options;
  options.policy = Parse<v1::PolicyConfig>(
      "default_policy { capacity: 30 } tenants { tenant: \"listed\" policy { capacity: 12 } }");
  auto s = TestServer::Start(options);
  ASSERT_NE(s, nullptr);
  ServerConnection c = Connect(*s);
  v1::BudgetStatus b;
  v1::BudgetPolicy shadow;
  shadow.set_mode(v1::MODE_SHADOW);
  ASSERT_TRUE(MaskedPut(c, "listed", shadow, {"mode"}, &b).ok());
  EXPECT_EQ(b.policy().capacity(), 12);
  EXPECT_EQ(b.policy().mode(), v1::MODE_SHADOW);
  EXPECT_TRUE(b.explicit_policy());
  ASSERT_TRUE(MaskedPut(c, "other", shadow, {"mode"}, &b).ok());
  EXPECT_EQ(b.policy().capacity(), 30);
  EXPECT_EQ(b.policy().mode(), v1::MODE_SHADOW);
}

// Threads flip the mode with masked puts while another puts whole policies of rising capacity:
// a flip never brings back a capacity older than the last whole put done before it was sent,
// and the last capacity stays.
TEST(PolicyMaskTest, ConcurrentModeFlipsAndWholePutsNeverLoseEachOthersFields) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  constexpr int kPuts = 150;
  constexpr int kFlippers = 3;
  constexpr int kFlips = 100;
  ASSERT_TRUE(s->PutPolicy("race", Parse<v1::BudgetPolicy>("capacity: 1"), nullptr).ok());
  std::atomic<int> last_done{1};
  std::atomic<int> stale{0};
  std::atomic<int> failed{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    ServerConnection c = Connect(*s);
    for (int i = 2; i <= kPuts; ++i) {
      v1::BudgetPolicy p;
      p.set_capacity(i);
      p.set_refill_per_second(i);
      if (!c.PutPolicy("race", p, nullptr).ok()) failed.fetch_add(1);
      last_done.store(i);
    }
  });
  for (int f = 0; f < kFlippers; ++f) {
    threads.emplace_back([&, f] {
      ServerConnection c = Connect(*s);
      for (int i = 0; i < kFlips; ++i) {
        const int before = last_done.load();
        v1::BudgetPolicy p;
        p.set_mode((i + f) % 2 == 0 ? v1::MODE_SHADOW : v1::MODE_ENFORCE);
        v1::BudgetStatus b;
        if (!MaskedPut(c, "race", p, {"mode"}, &b).ok()) {
          failed.fetch_add(1);
          continue;
        }
        if (b.policy().capacity() < before || b.policy().refill_per_second() < before ||
            b.policy().capacity() != b.policy().refill_per_second() ||
            b.policy().mode() != p.mode()) {
          stale.fetch_add(1);
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(stale.load(), 0);
  v1::BudgetStatus b;
  ASSERT_TRUE(s->GetBudget("race", &b).ok());
  EXPECT_EQ(b.policy().capacity(), kPuts);
  EXPECT_EQ(b.policy().refill_per_second(), kPuts);
  EXPECT_THAT(b.policy().mode(), ::testing::AnyOf(v1::MODE_ENFORCE, v1::MODE_SHADOW));
}

}  // namespace
}  // namespace retrybudget::testing
