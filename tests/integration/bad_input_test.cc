// Bad input to Sync, through the wire: every case gets INVALID_ARGUMENT whose message names the
// offending field, and changes nothing (the budgets, the tenant list and the instance's seq are
// as before; the next honest request is applied normally).
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace retrybudget::testing {
namespace {

using ::google::protobuf::util::MessageDifferencer;
using ::testing::HasSubstr;

// State before each case: instance "w" has applied seq 2 for tenant "t": 5 tokens received,
// 10 successes, 3 retries spent.
v1::SyncRequest Honest(uint64_t seq) {
  return Parse<v1::SyncRequest>(absl::StrCat(R"pb(
    instance_id: "w"
    seq: )pb", seq, R"pb(
    tenants {
      tenant: "t"
      successes: 10
      retries_spent: 3
      tokens_received: 5
      want: 5
    })pb"));
}

struct BadCase {
  std::string name;
  std::function<void(v1::SyncRequest&)> corrupt;  // applied to Honest(3)
  std::string field;                              // the message must contain this
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

v1::TenantSync* AddTenant(v1::SyncRequest& r, absl::string_view name) {
  v1::TenantSync* t = r.add_tenants();
  t->set_tenant(std::string(name));
  t->set_want(1);
  return t;
}

std::vector<BadCase> Cases() {
  return {
      {"EmptyTenant", [](auto& r) { r.mutable_tenants(0)->set_tenant(""); }, "tenants[0].tenant"},
      {"TenantOf129Characters",
       [](auto& r) { r.mutable_tenants(0)->set_tenant(std::string(129, 'a')); },
       "tenants[0].tenant"},
      {"TenantWithASpace", [](auto& r) { r.mutable_tenants(0)->set_tenant("pay ments"); },
       "tenants[0].tenant"},
      {"BadCharacterInSecondTenant", [](auto& r) { AddTenant(r, "a?b"); }, "tenants[1].tenant"},
      {"SameTenantTwice", [](auto& r) { AddTenant(r, "t"); }, "tenants[1].tenant"},
      {"TooManyTenantsInOneRequest",
       [](auto& r) {
         for (int i = 0; i < 256; ++i) AddTenant(r, absl::StrCat("tenant-", i));
       },
       "tenants has 257 entries"},
      {"AbsurdWant", [](auto& r) { r.mutable_tenants(0)->set_want(1'000'000'000'000); },
       "tenants[0].want"},
      {"SuccessesGoingBackwards", [](auto& r) { r.mutable_tenants(0)->set_successes(9); },
       "tenants[0].successes"},
      {"RetriesSpentGoingBackwards", [](auto& r) { r.mutable_tenants(0)->set_retries_spent(2); },
       "tenants[0].retries_spent"},
      {"TokensReceivedGoingBackwards",
       [](auto& r) {
         r.mutable_tenants(0)->set_tokens_received(4);
         r.mutable_tenants(0)->set_retries_spent(3);
       },
       "tokens_received"},
      {"TokensReceivedBeyondWhatWasGranted",
       [](auto& r) { r.mutable_tenants(0)->set_tokens_received(6); }, "tokens_received"},
      {"ReturningTokensNeverReceived",
       [](auto& r) { r.mutable_tenants(0)->set_tokens_returned(3); }, "tokens_returned"},
      {"SeqZero", [](auto& r) { r.set_seq(0); }, "seq"},
      {"LastSeqReusedWithDifferentContent", [](auto& r) { r.set_seq(2); }, "seq = 2"},
      {"EmptyInstanceId", [](auto& r) { r.set_instance_id(""); }, "instance_id"},
      {"InstanceIdWithASpace", [](auto& r) { r.set_instance_id("w 2"); }, "instance_id"},
      {"InstanceIdOf129Characters", [](auto& r) { r.set_instance_id(std::string(129, 'w')); },
       "instance_id"},
  };
}

class BadSyncInputTest : public ::testing::TestWithParam<BadCase> {
 protected:
  void SetUp() override {
    server_ = TestServer::Start();
    ASSERT_NE(server_, nullptr);
    v1::SyncResponse response;
    v1::SyncRequest first = Honest(1);
    first.mutable_tenants(0)->clear_successes();
    first.mutable_tenants(0)->clear_retries_spent();
    first.mutable_tenants(0)->clear_tokens_received();
    ASSERT_TRUE(server_->Sync(first, &response).ok());
    ASSERT_EQ(response.tenants(0).granted(), 5u);
    v1::SyncRequest second = Honest(2);
    second.mutable_tenants(0)->set_want(0);
    ASSERT_TRUE(server_->Sync(second, &response).ok());
  }

  std::unique_ptr<TestServer> server_;
};

TEST_P(BadSyncInputTest, IsRefusedNamingTheFieldAndChangesNothing) {
  v1::BudgetStatus before;
  ASSERT_TRUE(server_->GetBudget("t", &before).ok());
  v1::ListBudgetsResponse list_before;
  ASSERT_TRUE(server_->ListBudgets({}, &list_before).ok());

  v1::SyncRequest bad = Honest(3);
  GetParam().corrupt(bad);
  v1::SyncResponse response;
  const grpc::Status status = server_->Sync(bad, &response);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(GetParam().field));
  v1::BudgetStatus after;
  ASSERT_TRUE(server_->GetBudget("t", &after).ok());
  EXPECT_TRUE(MessageDifferencer::Equals(before, after))
      << before.DebugString() << " became " << after.DebugString();
  v1::ListBudgetsResponse list_after;
  ASSERT_TRUE(server_->ListBudgets({}, &list_after).ok());
  EXPECT_EQ(list_after.budgets_size(), list_before.budgets_size());

  // The refused request consumed nothing: seq 3 is still new and is applied in full.
  ASSERT_TRUE(server_->Sync(Honest(3), &response).ok());
  EXPECT_FALSE(response.stale());
  EXPECT_EQ(response.tenants(0).granted(), 5u);
}

INSTANTIATE_TEST_SUITE_P(Table, BadSyncInputTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

TEST(BadAdminInputTest, MalformedTenantNamesAreRefusedNamingTheField) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::BudgetStatus budget;
  for (const std::string& name : {std::string(""), std::string(129, 'x'), std::string("a b")}) {
    const grpc::Status get = s->GetBudget(name, &budget);
    EXPECT_EQ(get.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_THAT(get.error_message(), HasSubstr("tenant")) << name;
    const grpc::Status put = s->PutPolicy(name, {}, &budget);
    EXPECT_EQ(put.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_THAT(put.error_message(), HasSubstr("tenant")) << name;
  }
  v1::ListBudgetsResponse list;
  ASSERT_TRUE(s->ListBudgets({}, &list).ok());
  EXPECT_EQ(list.budgets_size(), 0);
}

TEST(BadAdminInputTest, InvalidPolicyIsRefusedNamingTheFieldAndChangesNothing) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->PutPolicy("t", Parse<v1::BudgetPolicy>("capacity: 10"), &budget).ok());

  const grpc::Status status =
      s->PutPolicy("t", Parse<v1::BudgetPolicy>("capacity: 10 lease_ttl_ms: 1"), &budget);

  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("lease_ttl_ms"));
  ASSERT_TRUE(s->GetBudget("t", &budget).ok());
  EXPECT_EQ(budget.policy().lease_ttl_ms(), 5000);
  EXPECT_EQ(budget.policy().capacity(), 10);
}

}  // namespace
}  // namespace retrybudget::testing
