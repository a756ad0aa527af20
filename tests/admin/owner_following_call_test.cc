// Admin calls about one tenant against a real 3-server cluster on a real etcd: a non-owner names
// the owner in the trailing metadata `retry-budget-owner`, and CallFollowingOwner
// (tools/admin/owner_following_call.h) gets the owner's answer through any server, and waits out
// a shard without owner after its owner was killed. The budgetctl binary's `mode` and `get` do
// the same through a non-owner.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/support/test_launcher.h"
#include "tools/admin/owner_following_call.h"

namespace retrybudget::admin {
namespace {

using ::testing::EndsWith;
using ::testing::Optional;

constexpr char kTenant[] = "payments";

std::unique_ptr<v1::BudgetAdminService::Stub> StubTo(const std::string& address) {
  return v1::BudgetAdminService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

void ShortDeadline(grpc::ClientContext& context) {
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

class OwnerFollowingCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::ClusterUnderTest>> started =
        testing::ClusterUnderTest::Start({.etcd = {.etcd_binary = RETRYBUDGET_ETCD_BIN},
                                          .servers = 3,
                                          .server_binary = RETRY_BUDGET_SERVER_BINARY,
                                          .lease_ttl = absl::Seconds(2)});
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = *std::move(started);
    // Shards move while the servers join; once settled, they stay where they are.
    const absl::Status balanced = cluster_->WaitUntilBalanced(absl::Seconds(20));
    ASSERT_TRUE(balanced.ok()) << balanced;
    // Shards balance while the servers join: wait until the tenant's owner has its budget (a
    // policy put through any server reaches it) and another server names that owner.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    bool settled = false;
    while (!settled && absl::Now() < deadline) {
      absl::StatusOr<int> owner = cluster_->OwnerOf(kTenant);
      if (owner.ok()) {
        owner_ = *owner;
        other_ = (owner_ + 1) % 3;
        settled = PutPolicyOnOwner().ok() && NamedByOther();
      }
      if (!settled) absl::SleepFor(absl::Milliseconds(100));
    }
    ASSERT_TRUE(settled) << "no settled owner of " << kTenant;
  }

  grpc::Status PutPolicyOnOwner() {
    auto to_owner = StubTo(cluster_->server(owner_).address());
    grpc::ClientContext context;
    ShortDeadline(context);
    v1::PutPolicyRequest request;
    request.set_tenant(kTenant);
    request.mutable_policy()->set_capacity(42);
    v1::PutPolicyResponse response;
    return to_owner->PutPolicy(&context, request, &response);
  }

  bool NamedByOther() {
    auto stub = StubTo(cluster_->server(other_).address());
    grpc::ClientContext context;
    ShortDeadline(context);
    v1::GetBudgetRequest request;
    request.set_tenant(kTenant);
    v1::GetBudgetResponse response;
    const grpc::Status status = stub->GetBudget(&context, request, &response);
    return status.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
           OwnerFromTrailers(context) == cluster_->server(owner_).address();
  }

  FollowedCall GetThrough(v1::BudgetAdminService::StubInterface& first,
                          v1::GetBudgetResponse* response, absl::Duration unavailable_for) {
    v1::GetBudgetRequest request;
    request.set_tenant(kTenant);
    return CallFollowingOwner(
        first, InsecureOwnerStubs(), ShortDeadline,
        [&](AdminStub& stub, grpc::ClientContext& context) {
          return stub.GetBudget(&context, request, response);
        },
        {.unavailable_for = unavailable_for});
  }

  // Runs the budgetctl binary with `args` and --server=<server `server`>; returns its exit code
  // and its stdout and stderr.
  std::pair<int, std::string> Budgetctl(std::vector<std::string> args, int server) {
    args.insert(args.begin(), BUDGETCTL_BINARY);
    args.push_back("--server=" + cluster_->server(server).address());
    const std::string path = absl::StrCat(::testing::TempDir(), "/budgetctl.", ::getpid(), ".",
                                          ++budgetctl_runs_, ".out");
    absl::StatusOr<std::unique_ptr<Subprocess>> child =
        Subprocess::Spawn(args, {.output_file = path});
    if (!child.ok()) return {-1, child.status().ToString()};
    absl::StatusOr<int> status = (*child)->Wait(absl::Now() + absl::Seconds(30));
    std::ifstream in(path);
    std::stringstream output;
    output << in.rdbuf();
    std::remove(path.c_str());
    if (!status.ok()) return {-1, output.str() + status.status().ToString()};
    return {WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, output.str()};
  }

  std::unique_ptr<testing::ClusterUnderTest> cluster_;
  int owner_ = -1;
  int other_ = -1;
  int budgetctl_runs_ = 0;
};

TEST_F(OwnerFollowingCallTest, NonOwnerNamesTheOwnerInTrailingMetadata) {
  auto stub = StubTo(cluster_->server(other_).address());
  grpc::ClientContext context;
  ShortDeadline(context);
  v1::GetBudgetRequest request;
  request.set_tenant(kTenant);
  v1::GetBudgetResponse response;
  const grpc::Status status = stub->GetBudget(&context, request, &response);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  const std::string owner = cluster_->server(owner_).address();
  EXPECT_THAT(OwnerFromTrailers(context), Optional(owner));
  EXPECT_THAT(status.error_message(), EndsWith(owner));
}

TEST_F(OwnerFollowingCallTest, GetBudgetThroughANonOwnerGetsTheOwnersAnswer) {
  auto stub = StubTo(cluster_->server(other_).address());
  v1::GetBudgetResponse response;
  FollowedCall call = GetThrough(*stub, &response, absl::Seconds(10));
  ASSERT_TRUE(call.status.ok()) << call.status.error_code() << ": "
                                << call.status.error_message();
  // The owner answered (the shard may still move while the cluster settles: then its new one).
  absl::StatusOr<int> owner = cluster_->OwnerOf(kTenant);
  ASSERT_TRUE(owner.ok()) << owner.status();
  EXPECT_EQ(call.answered_by, cluster_->server(*owner).address());
  EXPECT_GE(call.hops, 1);
  EXPECT_EQ(response.budget().tenant(), kTenant);
  EXPECT_EQ(response.budget().policy().capacity(), 42);
}

TEST_F(OwnerFollowingCallTest, DeleteBudgetThroughANonOwnerDeletesOnTheOwner) {
  auto stub = StubTo(cluster_->server(other_).address());
  v1::DeleteBudgetRequest request;
  request.set_tenant(kTenant);
  v1::DeleteBudgetResponse response;
  FollowedCall call = CallFollowingOwner(
      *stub, InsecureOwnerStubs(), ShortDeadline,
      [&](AdminStub& s, grpc::ClientContext& context) {
        return s.DeleteBudget(&context, request, &response);
      });
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.answered_by, cluster_->server(owner_).address());
}

TEST_F(OwnerFollowingCallTest, BudgetctlModeThroughANonOwnerSwitchesOnlyTheOwnersMode) {
  auto [code, output] = Budgetctl({"mode", kTenant, "shadow"}, other_);
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, ::testing::HasSubstr("capacity 42,"));
  EXPECT_THAT(output, ::testing::HasSubstr("mode shadow"));
  // The owner's budget: shadow, the rest of the policy kept.
  auto to_owner = StubTo(cluster_->server(owner_).address());
  v1::GetBudgetResponse response;
  FollowedCall call = GetThrough(*to_owner, &response, absl::Seconds(10));
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(response.budget().policy().mode(), v1::MODE_SHADOW);
  EXPECT_EQ(response.budget().policy().capacity(), 42);
  std::tie(code, output) = Budgetctl({"get", kTenant}, other_);
  ASSERT_EQ(code, 0) << output;
  EXPECT_THAT(output, ::testing::HasSubstr("mode:              shadow"));
  // An unknown mode is refused before anything is sent.
  std::tie(code, output) = Budgetctl({"mode", kTenant, "off"}, other_);
  EXPECT_EQ(code, 2) << output;
  EXPECT_THAT(output, ::testing::HasSubstr("MODE \"off\" is not a mode"));
}

TEST_F(OwnerFollowingCallTest, AShardWithoutOwnerIsWaitedOutUntilANewOwnerAnswers) {
  const std::string dead = cluster_->server(owner_).address();
  ASSERT_TRUE(cluster_->KillServer(owner_).ok());
  // Until etcd lets the dead owner's lease expire (2 s) and another server loads the shard, the
  // survivors name the dead owner (unreachable) or none: UNAVAILABLE, retried with backoff.
  auto stub = StubTo(cluster_->server(other_).address());
  v1::GetBudgetResponse response;
  FollowedCall call = GetThrough(*stub, &response, absl::Seconds(20));
  EXPECT_GE(call.unavailable_retries, 1);
  EXPECT_NE(call.answered_by, dead);
  // The new owner answers for the tenant: its budget (taken over from etcd) or NOT_FOUND if its
  // state had not been written yet; never a refusal.
  EXPECT_TRUE(call.status.ok() || call.status.error_code() == grpc::StatusCode::NOT_FOUND)
      << call.status.error_code() << ": " << call.status.error_message();
}

}  // namespace
}  // namespace retrybudget::admin
