// A tenant's mode and shape in every granted entry (and in the replay of one), and the totals
// of the counters issue 36 added (requests, shadow_denied, retries_allowed). Fake clock, no
// network.
#include <string>

#include "gtest/gtest.h"
#include "server/budget_core.h"

namespace retrybudget {
namespace {

struct Reported {
  uint64_t requests = 0;
  uint64_t requests_credited_locally = 0;
  uint64_t shadow_denied = 0;
  uint64_t retries_allowed = 0;
  uint64_t spent = 0;
  uint64_t received = 0;
  uint64_t want = 0;
};

v1::SyncRequest Request(const std::string& instance, uint64_t seq, const Reported& c,
                        const std::string& tenant = "t") {
  v1::SyncRequest r;
  r.set_instance_id(instance);
  r.set_seq(seq);
  v1::TenantSync* t = r.add_tenants();
  t->set_tenant(tenant);
  t->set_requests(c.requests);
  t->set_requests_credited_locally(c.requests_credited_locally);
  t->set_shadow_denied(c.shadow_denied);
  t->set_retries_allowed(c.retries_allowed);
  t->set_retries_spent(c.spent);
  t->set_tokens_received(c.received);
  t->set_want(c.want);
  return r;
}

class ModeAndTotalsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoreOptions options;
    v1::BudgetPolicy* p = options.policy.mutable_default_policy();
    p->set_capacity(100);
    p->set_refill_per_second(0);
    options.clock = &clock_;
    auto core = BudgetCore::Create(std::move(options));
    ASSERT_TRUE(core.ok()) << core.status();
    core_ = std::move(*core);
  }

  v1::SyncResponse Sync(const v1::SyncRequest& r) {
    auto response = core_->Sync(r);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::SyncResponse();
  }

  v1::BudgetStatus Status(const std::string& tenant = "t") {
    auto s = core_->GetBudget(tenant);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::BudgetStatus();
  }

  FakeClock clock_;
  std::unique_ptr<BudgetCore> core_;
};

TEST_F(ModeAndTotalsTest, EveryGrantCarriesTheTenantsModeAndAReplayTheModeItWasGrantedUnder) {
  const v1::SyncResponse enforced = Sync(Request("a", 1, {.want = 1}));
  ASSERT_EQ(enforced.tenants_size(), 1);
  EXPECT_EQ(enforced.tenants(0).mode(), v1::MODE_ENFORCE);
  EXPECT_EQ(enforced.tenants(0).safe_share().request_credit(), 0);  // the classic shape

  v1::BudgetPolicy shadow;
  shadow.set_capacity(100);
  shadow.set_mode(v1::MODE_SHADOW);
  ASSERT_TRUE(core_->PutPolicy("t", shadow).ok());
  EXPECT_EQ(Status().policy().mode(), v1::MODE_SHADOW);
  // A retry of the request granted under enforce gets that answer again, byte for byte.
  EXPECT_EQ(Sync(Request("a", 1, {.want = 1})).SerializeAsString(),
            enforced.SerializeAsString());
  const v1::SyncRequest next = Request("a", 2, {.received = 1, .want = 1});
  const v1::SyncResponse shadowed = Sync(next);
  EXPECT_EQ(shadowed.tenants(0).mode(), v1::MODE_SHADOW);
  EXPECT_EQ(Sync(next).SerializeAsString(), shadowed.SerializeAsString());

  shadow.set_mode(v1::MODE_ENFORCE);
  ASSERT_TRUE(core_->PutPolicy("t", shadow).ok());
  EXPECT_EQ(Sync(Request("a", 3, {.received = 2, .want = 1})).tenants(0).mode(),
            v1::MODE_ENFORCE);
}

TEST_F(ModeAndTotalsTest, AWindowedTenantsSafeShareCarriesTheUndividedRetryRatio) {
  v1::BudgetPolicy windowed;
  windowed.set_retry_ratio(0.25);
  windowed.set_mode(v1::MODE_SHADOW);
  ASSERT_TRUE(core_->PutPolicy("w", windowed).ok());
  Sync(Request("b", 1, {.want = 1}, "w"));  // a second instance: the share is not divided
  const v1::TenantGrant g = Sync(Request("a", 1, {.want = 1}, "w")).tenants(0);
  EXPECT_EQ(g.mode(), v1::MODE_SHADOW);
  EXPECT_EQ(g.safe_share().request_credit(), 0.25);
}

TEST_F(ModeAndTotalsTest, TheNewCountersAreTotalledExactlyOnceAndABaselineCountsNothing) {
  // First contact: a baseline, whatever it claims.
  Sync(Request("a", 1, {.requests = 1000, .shadow_denied = 50, .retries_allowed = 7,
                        .spent = 9, .received = 9, .want = 20}));
  EXPECT_EQ(Status().requests_total(), 0u);
  EXPECT_EQ(Status().shadow_denied_total(), 0u);
  EXPECT_EQ(Status().retries_allowed_total(), 0u);

  const v1::SyncRequest r = Request("a", 2, {.requests = 1030, .requests_credited_locally = 10,
                                             .shadow_denied = 54, .retries_allowed = 9,
                                             .spent = 19, .received = 29});
  Sync(r);
  Sync(r);  // a retry of the same request applies nothing again
  Sync(Request("a", 1, {.requests = 5000}));  // stale: nothing
  const v1::BudgetStatus s = Status();
  EXPECT_EQ(s.requests_total(), 30u);  // those credited locally are requests too
  EXPECT_EQ(s.shadow_denied_total(), 4u);
  EXPECT_EQ(s.retries_allowed_total(), 2u);
  EXPECT_EQ(s.retries_total(), 10u);  // tokens: a mean cost of 5
}

TEST_F(ModeAndTotalsTest, ACounterGoingBackwardsOrAPartOverItsWholeChangesNothing) {
  Sync(Request("a", 1, {.want = 10}));
  Sync(Request("a", 2, {.requests = 10, .shadow_denied = 3, .retries_allowed = 2, .spent = 2,
                        .received = 10}));
  auto back = core_->Sync(Request("a", 3, {.requests = 9, .shadow_denied = 3,
                                           .retries_allowed = 2, .spent = 2, .received = 10}));
  EXPECT_EQ(back.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(back.status().message().find("requests"), std::string::npos) << back.status();
  auto over = core_->Sync(Request("a", 3, {.requests = 10, .shadow_denied = 3,
                                           .retries_allowed = 3, .spent = 2, .received = 10}));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(over.status().message().find("retries_allowed"), std::string::npos)
      << over.status();
  const v1::BudgetStatus s = Status();
  EXPECT_EQ(s.requests_total(), 10u);
  EXPECT_EQ(s.shadow_denied_total(), 3u);
  EXPECT_EQ(s.retries_allowed_total(), 2u);
}

}  // namespace
}  // namespace retrybudget
