// BudgetAdminService through the wire, strict mode, and the message-size limit.
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

v1::SyncRequest OneTenant(absl::string_view instance, uint64_t seq, absl::string_view tenant,
                          uint64_t want) {
  v1::SyncRequest r;
  r.set_instance_id(std::string(instance));
  r.set_seq(seq);
  v1::TenantSync* t = r.add_tenants();
  t->set_tenant(std::string(tenant));
  t->set_want(want);
  return r;
}

TEST(AdminTest, GetBudgetOfAnUnknownTenantIsNotFound) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::BudgetStatus budget;
  const grpc::Status status = s->GetBudget("nobody", &budget);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("\"nobody\""));
}

TEST(AdminTest, GetBudgetShowsPolicyLevelAndTotalsOfATenantCreatedBySync) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(OneTenant("w", 1, "orders", 8), &response).ok());

  v1::BudgetStatus budget;
  ASSERT_TRUE(s->GetBudget("orders", &budget).ok());
  EXPECT_EQ(budget.tenant(), "orders");
  EXPECT_FALSE(budget.explicit_policy());
  EXPECT_EQ(budget.policy().capacity(), 100);
  EXPECT_EQ(budget.policy().refill_per_second(), 1);
  EXPECT_DOUBLE_EQ(budget.policy().success_credit(), 0.1);
  EXPECT_EQ(budget.policy().lease_ttl_ms(), 5000);
  EXPECT_DOUBLE_EQ(budget.tokens(), 92);
  EXPECT_EQ(budget.granted_total(), 8u);
  EXPECT_EQ(budget.wanted_total(), 8u);
  EXPECT_EQ(budget.active_instances(), 1u);
}

TEST(AdminTest, PutPolicyCreatesThenChangesAPolicyKeepingTheLevelCapped) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->PutPolicy("search", Parse<v1::BudgetPolicy>("capacity: 50 refill_per_second: 2"),
                           &budget)
                  .ok());
  EXPECT_TRUE(budget.explicit_policy());
  EXPECT_DOUBLE_EQ(budget.tokens(), 50);

  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(OneTenant("w", 1, "search", 10), &response).ok());
  ASSERT_EQ(response.tenants(0).granted(), 10u);  // level 40

  ASSERT_TRUE(s->PutPolicy("search", Parse<v1::BudgetPolicy>("capacity: 30"), &budget).ok());
  EXPECT_DOUBLE_EQ(budget.tokens(), 30);  // capped at the new capacity
  EXPECT_EQ(budget.policy().capacity(), 30);
  EXPECT_EQ(budget.policy().refill_per_second(), 1);  // unset: the default again
  ASSERT_TRUE(s->GetBudget("search", &budget).ok());
  EXPECT_DOUBLE_EQ(budget.tokens(), 30);
  EXPECT_EQ(budget.granted_total(), 10u);
}

TEST(AdminTest, ListBudgetsPagesInNameOrder) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::BudgetStatus budget;
  for (const char* name : {"c", "a", "e", "b", "d"}) {
    ASSERT_TRUE(s->PutPolicy(name, {}, &budget).ok());
  }

  std::vector<std::string> seen;
  v1::ListBudgetsRequest request;
  request.set_page_size(2);
  for (int page = 0; page < 10; ++page) {
    v1::ListBudgetsResponse response;
    ASSERT_TRUE(s->ListBudgets(request, &response).ok());
    EXPECT_LE(response.budgets_size(), 2);
    for (const auto& b : response.budgets()) seen.push_back(b.tenant());
    if (response.next_page_token().empty()) break;
    request.set_page_token(response.next_page_token());
  }
  EXPECT_THAT(seen, ::testing::ElementsAre("a", "b", "c", "d", "e"));
}

TEST(AdminTest, DeleteBudgetForgetsTheTenantAndSecondDeleteIsNotFound) {
  auto s = TestServer::Start();
  ASSERT_NE(s, nullptr);
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->PutPolicy("gone", Parse<v1::BudgetPolicy>("capacity: 7"), &budget).ok());

  ASSERT_TRUE(s->DeleteBudget("gone").ok());

  EXPECT_EQ(s->GetBudget("gone", &budget).error_code(), grpc::StatusCode::NOT_FOUND);
  const grpc::Status again = s->DeleteBudget("gone");
  EXPECT_EQ(again.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(again.error_message(), HasSubstr("\"gone\""));
  // A later Sync recreates it with the default policy (the server is not strict).
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(OneTenant("w", 1, "gone", 1), &response).ok());
  EXPECT_EQ(response.tenants(0).capacity(), 100);
}

TEST(StrictModeTest, UnknownTenantGetsANotFoundEntryAndTheKnownOneIsGranted) {
  auto s = TestServer::Start({.policy = Parse<v1::PolicyConfig>(R"pb(
    strict: true
    tenants { tenant: "known" policy { capacity: 20 } })pb")});
  ASSERT_NE(s, nullptr);
  v1::SyncRequest request = OneTenant("w", 1, "known", 4);
  request.add_tenants()->set_tenant("stranger");
  request.mutable_tenants(1)->set_want(4);

  v1::SyncResponse response;
  const grpc::Status status = s->Sync(request, &response);

  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.tenants_size(), 2);
  EXPECT_FALSE(response.tenants(0).has_error());
  EXPECT_EQ(response.tenants(0).granted(), 4u);
  EXPECT_EQ(response.tenants(1).tenant(), "stranger");
  EXPECT_EQ(response.tenants(1).error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_THAT(response.tenants(1).error().message(), HasSubstr("\"stranger\""));
  EXPECT_EQ(response.tenants(1).granted(), 0u);
  v1::BudgetStatus budget;
  EXPECT_EQ(s->GetBudget("stranger", &budget).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(StrictModeTest, PutPolicyAdmitsATenantOnAStrictServer) {
  auto s = TestServer::Start({.policy = Parse<v1::PolicyConfig>("strict: true")});
  ASSERT_NE(s, nullptr);
  v1::SyncResponse response;
  ASSERT_TRUE(s->Sync(OneTenant("w", 1, "late", 2), &response).ok());
  ASSERT_EQ(response.tenants(0).error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  v1::BudgetStatus budget;
  ASSERT_TRUE(s->PutPolicy("late", Parse<v1::BudgetPolicy>("capacity: 5"), &budget).ok());
  ASSERT_TRUE(s->Sync(OneTenant("w", 2, "late", 2), &response).ok());
  EXPECT_FALSE(response.tenants(0).has_error());
  EXPECT_EQ(response.tenants(0).granted(), 2u);
}

TEST(MessageLimitTest, OversizeRequestIsRefusedAndTheServerKeepsServing) {
  constexpr int kLimit = 64 * 1024;
  auto s = TestServer::Start({.max_message_bytes = kLimit});
  ASSERT_NE(s, nullptr);
  v1::SyncRequest huge = OneTenant("w", 1, "t", 1);
  for (int i = 0; i < 3000; ++i) {  // ~3000 * 40 bytes: well over 64 KiB
    huge.add_tenants()->set_tenant(absl::StrCat("tenant-with-a-longish-name-", i));
  }
  ASSERT_GT(huge.ByteSizeLong(), static_cast<size_t>(kLimit));

  v1::SyncResponse response;
  const grpc::Status refused = s->Sync(huge, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();

  const grpc::Status next = s->Sync(OneTenant("w", 1, "t", 3), &response);
  ASSERT_TRUE(next.ok()) << next.error_message();
  EXPECT_EQ(response.tenants(0).granted(), 3u);
  v1::BudgetStatus budget;
  ASSERT_TRUE(s->GetBudget("t", &budget).ok());
  EXPECT_EQ(budget.granted_total(), 3u);  // the refused request applied nothing
}

}  // namespace
}  // namespace retrybudget::testing
