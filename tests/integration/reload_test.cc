// Policy reload on SIGHUP through the real binary: a new capacity applies and the level is kept;
// new credentials replace the old ones; a broken file is refused with the line and field named,
// the old policy stays, and the server keeps serving.
#include <signal.h>

#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/bearer_authorizer.h"
#include "tests/integration/server_process.h"

namespace retrybudget::testing {
namespace {

using ::testing::HasSubstr;

// Waits (real time: the server acts on the signal asynchronously) until `text` appears in the
// server's output `count` times.
bool WaitForLog(const ServerProcess& server, const std::string& text, int count = 1) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    const std::string out = server.Output();
    int n = 0;
    for (size_t pos = out.find(text); pos != std::string::npos; pos = out.find(text, pos + 1)) ++n;
    if (n >= count) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

std::string Policy(int capacity) {
  return absl::StrCat("default_policy { capacity: ", capacity,
                      " refill_per_second: 0 success_credit: 0 }\n");
}

TEST(ReloadTest, SighupAppliesTheNewCapacityAndKeepsTheLevel) {
  ScopedTempDir dir;
  const std::string policy = dir.path() + "/policy.textproto";
  WriteFile(policy, Policy(100));
  auto server = ServerProcess::Start(dir.path(), {"--policy=" + policy});
  ASSERT_NE(server, nullptr);
  ServerConnection c = server->Connect();
  v1::SyncResponse r;
  ASSERT_TRUE(c.Sync(SyncOf("i", 1, "t", 30), &r).ok());
  v1::BudgetStatus before;
  ASSERT_TRUE(c.GetBudget("t", &before).ok());
  ASSERT_EQ(before.policy().capacity(), 100);
  ASSERT_EQ(before.tokens(), 70);

  WriteFile(policy, Policy(500));
  server->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "SIGHUP: policy reloaded")) << server->Output();
  v1::BudgetStatus after;
  ASSERT_TRUE(c.GetBudget("t", &after).ok());
  EXPECT_EQ(after.policy().capacity(), 500);
  EXPECT_EQ(after.tokens(), before.tokens());
  EXPECT_EQ(after.granted_total(), before.granted_total());

  // A broken file: refused naming the line and the field; the old (reloaded) policy stays.
  WriteFile(policy, "default_policy {\n  capacity: 50\n  refill_per_secnd: 3\n}\n");
  server->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "policy reload refused")) << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr(policy));
  EXPECT_THAT(server->Output(), HasSubstr("line 3"));
  EXPECT_THAT(server->Output(), HasSubstr("refill_per_secnd"));
  // An out-of-range value: refused naming the field.
  WriteFile(policy, "default_policy { capacity: -1 }\n");
  server->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "policy reload refused", 2)) << server->Output();
  EXPECT_THAT(server->Output(), HasSubstr("default_policy.capacity"));

  v1::BudgetStatus still;
  ASSERT_TRUE(c.GetBudget("t", &still).ok());
  EXPECT_EQ(still.policy().capacity(), 500);
  EXPECT_EQ(still.tokens(), before.tokens());
  ASSERT_TRUE(c.Sync(SyncOf("i", 2, "t", 5, 30), &r).ok());  // still serving
  EXPECT_EQ(r.tenants(0).granted(), 5u);
  EXPECT_EQ(r.tenants(0).capacity(), 500);
  EXPECT_EQ(server->Stop(SIGTERM), 0) << server->Output();
}

std::string HexSha256(absl::string_view token) {
  std::string hex;
  for (uint8_t b : Sha256(token)) absl::StrAppend(&hex, absl::Hex(b, absl::kZeroPad2));
  return hex;
}

TEST(ReloadTest, SighupReplacesTheCredentials) {
  ScopedTempDir dir;
  const std::string policy = dir.path() + "/policy.textproto";
  auto with_credential = [&](absl::string_view token) {
    return absl::StrCat(Policy(100), "credentials { name: \"w\" token_sha256: \"",
                        HexSha256(token), "\" tenants: \"t\" }\n");
  };
  WriteFile(policy, with_credential("old-token"));
  auto server = ServerProcess::Start(dir.path(), {"--policy=" + policy});
  ASSERT_NE(server, nullptr);
  v1::SyncResponse r;
  ServerConnection old_token = server->Connect("old-token");
  ServerConnection new_token = server->Connect("new-token");
  ASSERT_TRUE(old_token.Sync(SyncOf("i", 1, "t", 1), &r).ok());
  EXPECT_EQ(new_token.Sync(SyncOf("j", 1, "t", 1), &r).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  WriteFile(policy, with_credential("new-token"));
  server->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "SIGHUP: policy reloaded")) << server->Output();
  EXPECT_EQ(old_token.Sync(SyncOf("i", 2, "t", 1, 1), &r).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_TRUE(new_token.Sync(SyncOf("j", 2, "t", 1), &r).ok());

  // Removing every credential opens the server again (the documented default).
  WriteFile(policy, Policy(100));
  server->process().Signal(SIGHUP);
  ASSERT_TRUE(WaitForLog(*server, "SIGHUP: policy reloaded", 2)) << server->Output();
  EXPECT_TRUE(server->Connect().Sync(SyncOf("k", 1, "t", 1), &r).ok());
  EXPECT_EQ(server->Stop(SIGTERM), 0);
}

}  // namespace
}  // namespace retrybudget::testing
