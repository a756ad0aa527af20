#include "server/policy.h"

#include <cstdio>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace retrybudget {
namespace {

using ::testing::HasSubstr;

TEST(PolicyTest, EmptyPolicyGetsTheDocumentedDefaults) {
  auto p = ResolvePolicy(v1::BudgetPolicy());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->capacity, 100);
  EXPECT_EQ(p->refill_per_second, 1);
  EXPECT_EQ(p->success_credit, 0.1);
  EXPECT_EQ(p->initial_tokens, 100);
  EXPECT_EQ(p->lease_ttl, absl::Seconds(5));
}

TEST(PolicyTableTest, OneSharedCopyPerDistinctPolicyAndNoneKeptForPoliciesNoLongerHeld) {
  PolicyTable table;
  ResolvedPolicy a;
  ResolvedPolicy b = a;
  b.lease_ttl = absl::Seconds(7);
  auto a1 = table.Intern(a);
  auto a2 = table.Intern(a);
  auto b1 = table.Intern(b);
  EXPECT_EQ(a1.get(), a2.get());
  EXPECT_NE(a1.get(), b1.get());
  EXPECT_EQ(*b1, b);
  // Thousands of distinct policies, each let go at once (an admin changing one budget's
  // policy over and over): the table keeps a bounded number of entries, and the ones still
  // held keep their copies.
  for (int i = 0; i < 10'000; ++i) {
    ResolvedPolicy p;
    p.capacity = 1000 + i;
    (void)table.Intern(p);
  }
  EXPECT_LT(table.size(), 200u);
  EXPECT_EQ(table.Intern(a).get(), a1.get());
  EXPECT_EQ(table.Intern(b).get(), b1.get());
}

TEST(PolicyTest, WindowedShapeTakesLinkerdsDefaultsAndImpliesItsFloorAsTheBucket) {
  v1::BudgetPolicy in;
  in.set_retry_ratio(0.25);
  auto p = ResolvePolicy(in);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->windowed);
  EXPECT_EQ(p->retry_ratio, 0.25);
  EXPECT_EQ(p->min_retries_per_second, 10);
  EXPECT_EQ(p->ttl, absl::Seconds(10));
  EXPECT_EQ(p->lease_ttl, absl::Seconds(1));  // ttl / 10
  EXPECT_EQ(p->capacity, 100);                // the floor of one window
  EXPECT_EQ(p->success_credit, 0);
  // ToProto names only the windowed fields, so that it resolves to the same policy again.
  const v1::BudgetPolicy out = p->ToProto();
  EXPECT_FALSE(out.has_capacity());
  EXPECT_FALSE(out.has_success_credit());
  EXPECT_EQ(out.ttl_ms(), 10'000);
  auto again = ResolvePolicy(out);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *p);
}

TEST(PolicyTest, WindowedFieldsAreCheckedAndNamedWithTheirValue) {
  struct Case {
    v1::BudgetPolicy policy;
    const char* expected;
  };
  std::vector<Case> cases(6);
  cases[0].policy.set_retry_ratio(10.5);
  cases[0].expected = "p.retry_ratio = 10.5 is invalid: must be in [0, 10]";
  cases[1].policy.set_min_retries_per_second(-1);
  cases[1].expected = "p.min_retries_per_second = -1";
  cases[2].policy.set_ttl_ms(999);
  cases[2].expected = "p.ttl_ms = 999 is invalid: must be in [1000, 60000]";
  cases[3].policy.set_ttl_ms(60'001);
  cases[3].expected = "p.ttl_ms = 60001";
  cases[4].policy.set_ttl_ms(2'000);
  cases[4].policy.set_lease_ttl_ms(2'001);
  cases[4].expected = "p.lease_ttl_ms = 2001 is invalid: must be in [100, ttl_ms = 2000]";
  cases[5].policy.set_retry_ratio(std::numeric_limits<double>::infinity());
  cases[5].expected = "p.retry_ratio = inf";
  for (const auto& c : cases) {
    auto p = ResolvePolicy(c.policy, "p");
    ASSERT_FALSE(p.ok()) << c.expected;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(p.status().message(), HasSubstr(c.expected));
  }
}

TEST(PolicyTest, APolicySettingBothShapesIsRefusedNamingTheFields) {
  v1::BudgetPolicy in;
  in.set_capacity(50);
  in.set_success_credit(0.1);
  in.set_retry_ratio(0.2);
  in.set_ttl_ms(5'000);
  auto p = ResolvePolicy(in, "p");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(p.status().message(),
              HasSubstr("p sets fields of both shapes: capacity, success_credit (the token "
                        "bucket) and retry_ratio, ttl_ms (the windowed ratio)"));
}

TEST(PolicyTest, ModeIsEnforceByDefaultShadowOnRequestAndAnUnknownValueIsNamed) {
  v1::BudgetPolicy in;
  auto p = ResolvePolicy(in);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->shadow);
  EXPECT_EQ(p->ToProto().mode(), v1::MODE_ENFORCE);
  in.set_mode(v1::MODE_SHADOW);
  p = ResolvePolicy(in);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->shadow);
  EXPECT_EQ(p->ToProto().mode(), v1::MODE_SHADOW);
  in.set_mode(static_cast<v1::Mode>(7));
  p = ResolvePolicy(in, "p");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(),
              HasSubstr("p.mode = 7 is invalid: must be MODE_ENFORCE (1) or MODE_SHADOW (2)"));
}

TEST(PolicyTest, InitialTokensDefaultToCapacityAndExplicitZeroIsKept) {
  v1::BudgetPolicy in;
  in.set_capacity(40);
  auto p = ResolvePolicy(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->initial_tokens, 40);
  in.set_initial_tokens(0);
  in.set_refill_per_second(0);
  p = ResolvePolicy(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->initial_tokens, 0);
  EXPECT_EQ(p->refill_per_second, 0);
}

TEST(PolicyTest, OutOfRangeFieldsAreNamedWithTheirValue) {
  struct Case {
    v1::BudgetPolicy policy;
    const char* expected;
  };
  std::vector<Case> cases(5);
  cases[0].policy.set_capacity(0);
  cases[0].expected = "p.capacity = 0";
  cases[1].policy.set_refill_per_second(-1);
  cases[1].expected = "p.refill_per_second = -1";
  cases[2].policy.set_success_credit(std::numeric_limits<double>::quiet_NaN());
  cases[2].expected = "p.success_credit = nan";
  cases[3].policy.set_capacity(10);
  cases[3].policy.set_initial_tokens(11);
  cases[3].expected = "p.initial_tokens = 11";
  cases[4].policy.set_lease_ttl_ms(5);
  cases[4].expected = "p.lease_ttl_ms = 5";
  for (const auto& c : cases) {
    auto p = ResolvePolicy(c.policy, "p");
    ASSERT_FALSE(p.ok()) << c.expected;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(p.status().message()), HasSubstr(c.expected));
  }
}

TEST(PolicyTest, ParsesTextFormat) {
  auto config = ParsePolicyConfig(R"(
    default_policy { capacity: 50 refill_per_second: 2 }
    strict: true
    tenants { tenant: "payments" policy { capacity: 10 success_credit: 0.5 } }
  )");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->strict());
  EXPECT_EQ(config->default_policy().capacity(), 50);
  ASSERT_EQ(config->tenants_size(), 1);
  EXPECT_EQ(config->tenants(0).policy().success_credit(), 0.5);
}

TEST(PolicyTest, ParsesJson) {
  auto config = ParsePolicyConfig(R"({
    "defaultPolicy": {"capacity": 50},
    "tenants": [{"tenant": "search", "policy": {"refillPerSecond": 3, "leaseTtlMs": "2000"}}]
  })");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->tenants(0).policy().refill_per_second(), 3);
  EXPECT_EQ(config->tenants(0).policy().lease_ttl_ms(), 2000);
}

TEST(PolicyTest, TextSyntaxErrorNamesLineAndField) {
  auto config = ParsePolicyConfig("default_policy {\n  capacity: 5\n  capasity: 3\n}\n");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("line 3"));
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("capasity"));
}

TEST(PolicyTest, JsonErrorIsReported) {
  auto config = ParsePolicyConfig(R"({"defaultPolicy": {"capacity": "lots"}})");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()), HasSubstr("JSON"));
}

TEST(PolicyTest, InvalidTenantPolicyIsNamedByIndex) {
  auto config = ParsePolicyConfig(
      "tenants { tenant: \"a\" }\ntenants { tenant: \"b\" policy { capacity: -3 } }");
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(std::string(config.status().message()),
              HasSubstr("tenants[1].policy.capacity = -3"));
}

TEST(PolicyTest, DuplicateAndMalformedTenantNamesAreRefused) {
  auto dup = ParsePolicyConfig("tenants { tenant: \"a\" }\ntenants { tenant: \"a\" }");
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(std::string(dup.status().message()), HasSubstr("listed twice"));
  auto bad = ParsePolicyConfig("tenants { tenant: \"has space\" }");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("tenants[0].tenant"));
}

TEST(PolicyTest, LoadPolicyFileNamesThePath) {
  auto missing = LoadPolicyFile("/nonexistent/policy.txtpb");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/policy.txtpb"));

  const std::string path = ::testing::TempDir() + "/policy_test.txtpb";
  std::ofstream(path) << "default_policy { capacity: -1 }\n";
  auto bad = LoadPolicyFile(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("default_policy.capacity = -1"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace retrybudget

namespace retrybudget {
namespace {

constexpr char kHash[] = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

TEST(PolicyCredentialsTest, ParsesCredentials) {
  auto config = ParsePolicyConfig(absl::StrCat(
      "credentials { name: \"payments-workers\" token_sha256: \"", kHash,
      "\" tenants: \"payments\" tenants: \"payments/db\" }\n"));
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->credentials(0).tenants_size(), 2);
}

TEST(PolicyCredentialsTest, RefusesMalformedCredentialsNamingTheField) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"credentials { token_sha256: \"" + std::string(kHash) + "\" admin: true }",
       "credentials[0].name is empty"},
      {"credentials { name: \"a\" token_sha256: \"abc\" admin: true }",
       "credentials[0].token_sha256 \"abc\" is not 64 lowercase hex"},
      {"credentials { name: \"a\" token_sha256: \"" + std::string(kHash) + "\" }",
       "grants nothing"},
      {"credentials { name: \"a\" token_sha256: \"" + std::string(kHash) +
           "\" tenants: \"bad name\" }",
       "credentials[0].tenants[0]"},
      {"credentials { name: \"a\" token_sha256: \"" + std::string(kHash) +
           "\" admin: true }\ncredentials { name: \"a\" token_sha256: \"" +
           std::string(64, 'a') + "\" admin: true }",
       "credentials[1].name \"a\" is listed twice"},
  };
  for (const auto& [text, expected] : cases) {
    auto config = ParsePolicyConfig(text);
    ASSERT_FALSE(config.ok()) << text;
    EXPECT_THAT(std::string(config.status().message()), HasSubstr(expected)) << text;
  }
}

}  // namespace
}  // namespace retrybudget
