// The real retry-budget-server binary, as a child process: port 0 + --port_file, a Sync over the
// wire, clean shutdown on SIGTERM/SIGINT with an in-flight RPC completing, flag wiring, and
// policy-file errors (exit code 2, a message naming the file and the field).
#include <signal.h>

#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/integration/child_process.h"
#include "tests/support/test_launcher.h"

#ifndef RETRY_BUDGET_SERVER_BINARY
#error "RETRY_BUDGET_SERVER_BINARY must name the retry-budget-server binary"
#endif

namespace retrybudget::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kExitTimeout = absl::Seconds(20);

// A server binary started on 127.0.0.1:0 with a port file in a fresh directory, by the one
// launcher of servers under test (metrics off: parallel test servers must not compete for the
// default metrics port).
struct RunningServer {
  std::unique_ptr<ServerUnderTest> process;
  int port = 0;
  std::unique_ptr<v1::RetryBudgetService::Stub> stub;
  std::unique_ptr<v1::BudgetAdminService::Stub> admin;

  static std::unique_ptr<RunningServer> Start(std::vector<std::string> extra_args = {}) {
    auto s = std::make_unique<RunningServer>();
    absl::StatusOr<std::unique_ptr<ServerUnderTest>> server = ServerUnderTest::Start(
        {.binary = RETRY_BUDGET_SERVER_BINARY, .flags = std::move(extra_args),
         .timeout = kStartTimeout});
    if (!server.ok()) {
      ADD_FAILURE() << server.status();
      return nullptr;
    }
    s->process = *std::move(server);
    s->port = s->process->port();
    grpc::ChannelArguments channel_args;
    channel_args.SetMaxSendMessageSize(-1);
    auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", s->port),
                                             grpc::InsecureChannelCredentials(), channel_args);
    s->stub = v1::RetryBudgetService::NewStub(channel);
    s->admin = v1::BudgetAdminService::NewStub(channel);
    return s;
  }

  grpc::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub->Sync(&context, request, response);
  }
};

v1::SyncRequest OneTenant(uint64_t seq, absl::string_view tenant, uint64_t want,
                          uint64_t received = 0) {
  v1::SyncRequest r;
  r.set_instance_id("binary-test");
  r.set_seq(seq);
  v1::TenantSync* t = r.add_tenants();
  t->set_tenant(std::string(tenant));
  t->set_want(want);
  t->set_tokens_received(received);
  return r;
}

TEST(ServerBinaryTest, ServesOnThePortItWritesAndExitsZeroOnSigint) {
  auto server = RunningServer::Start();
  ASSERT_NE(server, nullptr);

  v1::SyncResponse response;
  const grpc::Status status = server->Sync(OneTenant(1, "payments", 5), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.tenants(0).granted(), 5u);
  EXPECT_EQ(response.tenants(0).capacity(), 100);  // the built-in default policy
  EXPECT_EQ(response.tenants(0).lease_ttl_ms(), 5000);

  server->process->Signal(SIGINT);
  EXPECT_EQ(server->process->WaitForExit(kExitTimeout), 0) << server->process->Log();
  const std::string log = server->process->Log();
  EXPECT_THAT(log, HasSubstr(absl::StrCat("listening on 127.0.0.1:", server->port)));
  EXPECT_THAT(log, HasSubstr("INSECURE"));
  EXPECT_THAT(log, HasSubstr("SIGINT"));
  EXPECT_THAT(log, HasSubstr("stopped"));
}

TEST(ServerBinaryTest, SigtermLetsAnInFlightSyncFinishThenExitsZero) {
  // Each Sync response is held back 1.5 s, so the second Sync is surely in flight at SIGTERM.
  auto server = RunningServer::Start({"--testonly_sync_response_delay=1.5s"});
  ASSERT_NE(server, nullptr);
  v1::SyncResponse first;
  ASSERT_TRUE(server->Sync(OneTenant(1, "t", 3), &first).ok());  // connects the channel
  ASSERT_EQ(first.tenants(0).granted(), 3u);

  v1::SyncResponse in_flight;
  std::future<grpc::Status> call = std::async(std::launch::async, [&] {
    return server->Sync(OneTenant(2, "t", 4, 3), &in_flight);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // the request reaches the server
  ASSERT_EQ(call.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the Sync was not held in flight";
  server->process->Signal(SIGTERM);

  const grpc::Status status = call.get();
  EXPECT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_EQ(in_flight.tenants_size(), 1);
  EXPECT_EQ(in_flight.tenants(0).granted(), 4u);
  EXPECT_EQ(server->process->WaitForExit(kExitTimeout), 0) << server->process->Log();
  EXPECT_THAT(server->process->Log(), HasSubstr("SIGTERM"));

  // It is gone: a new call fails.
  v1::SyncResponse after;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  EXPECT_FALSE(server->stub->Sync(&context, OneTenant(3, "t", 1, 7), &after).ok());
}

TEST(ServerBinaryTest, PolicyFileStrictFlagAndMessageLimitAreApplied) {
  ScopedTempDir dir;
  const std::string policy = dir.path() + "/policy.json";
  std::ofstream(policy) << R"({
    "defaultPolicy": {"capacity": 10},
    "tenants": [{"tenant": "known", "policy": {"capacity": 3, "leaseTtlMs": "2000"}}]
  })";
  auto server =
      RunningServer::Start({"--policy=" + policy, "--strict", "--max_message_bytes=4096"});
  ASSERT_NE(server, nullptr);

  v1::SyncRequest request = OneTenant(1, "known", 10);
  request.add_tenants()->set_tenant("stranger");
  v1::SyncResponse response;
  ASSERT_TRUE(server->Sync(request, &response).ok());
  EXPECT_EQ(response.tenants(0).granted(), 3u);
  EXPECT_EQ(response.tenants(0).lease_ttl_ms(), 2000);
  EXPECT_EQ(response.tenants(1).error().code(), static_cast<int>(grpc::StatusCode::NOT_FOUND));

  v1::SyncRequest huge = OneTenant(2, "known", 0, 3);
  huge.set_instance_id(std::string(5000, 'x'));  // over 4096 bytes on the wire
  const grpc::Status refused = server->Sync(huge, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << refused.error_message();
  EXPECT_TRUE(server->Sync(OneTenant(2, "known", 0, 3), &response).ok());

  server->process->Signal(SIGTERM);
  EXPECT_EQ(server->process->WaitForExit(kExitTimeout), 0) << server->process->Log();
  EXPECT_THAT(server->process->Log(), HasSubstr("strict"));
}

struct BadPolicy {
  std::string name;
  std::string file_name;
  std::string contents;
  std::vector<std::string> expected;  // all must appear in the output
};

void PrintTo(const BadPolicy& p, std::ostream* os) { *os << p.name; }

class BadPolicyFileTest : public ::testing::TestWithParam<BadPolicy> {};

TEST_P(BadPolicyFileTest, ExitsTwoNamingTheFileAndTheField) {
  ScopedTempDir dir;
  const std::string path = dir.path() + "/" + GetParam().file_name;
  if (!GetParam().contents.empty()) std::ofstream(path) << GetParam().contents;
  auto process = ChildProcess::Start(RETRY_BUDGET_SERVER_BINARY,
                                     {"--listen=127.0.0.1:0", "--policy=" + path},
                                     dir.path() + "/output");
  ASSERT_TRUE(process.has_value());

  EXPECT_EQ(process->Wait(kExitTimeout), 2);
  const std::string output = process->Output();
  EXPECT_THAT(output, HasSubstr(path));
  for (const std::string& e : GetParam().expected) EXPECT_THAT(output, HasSubstr(e));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("listening on")));
}

INSTANTIATE_TEST_SUITE_P(
    Table, BadPolicyFileTest,
    ::testing::Values(
        BadPolicy{"TextOutOfRange", "p.textproto", "default_policy {\n  capacity: -5\n}\n",
                  {"default_policy.capacity"}},
        BadPolicy{"TextUnknownField", "p.textproto", "default_policy {\n  capacty: 5\n}\n",
                  {"line 2", "capacty"}},
        BadPolicy{"TextBadTenantName", "p.textproto", "tenants { tenant: \"a b\" }\n",
                  {"tenants[0].tenant"}},
        BadPolicy{"TextTenantListedTwice", "p.textproto",
                  "tenants { tenant: \"a\" }\ntenants { tenant: \"a\" }\n",
                  {"tenants[1].tenant", "twice"}},
        BadPolicy{"JsonOutOfRange", "p.json", R"({"defaultPolicy": {"leaseTtlMs": "5"}})",
                  {"default_policy.lease_ttl_ms"}},
        BadPolicy{"JsonInitialAboveCapacity", "p.json",
                  R"({"tenants": [{"tenant": "x", "policy": {"capacity": 5, "initialTokens": 9}}]})",
                  {"tenants[0].policy.initial_tokens"}},
        BadPolicy{"JsonUnknownField", "p.json", R"({"defaultPolicy": {"capacityy": 5}})",
                  {"capacityy"}},
        BadPolicy{"MissingFile", "absent.textproto", "", {"cannot be read"}}),
    [](const auto& info) { return info.param.name; });

TEST(ServerBinaryFlagsTest, BadListenAddressExitsTwo) {
  ScopedTempDir dir;
  auto process =
      ChildProcess::Start(RETRY_BUDGET_SERVER_BINARY, {"--listen=nonsense"}, dir.path() + "/output");
  ASSERT_TRUE(process.has_value());
  EXPECT_EQ(process->Wait(kExitTimeout), 2);
  EXPECT_THAT(process->Output(), HasSubstr("nonsense"));
}

TEST(ServerBinaryTest, PortInUseByAnotherServerIsRefusedNotShared) {
  auto first = RunningServer::Start();
  ASSERT_NE(first, nullptr);
  ScopedTempDir dir;
  auto second = ChildProcess::Start(
      RETRY_BUDGET_SERVER_BINARY,
      {absl::StrCat("--listen=127.0.0.1:", first->port), "--metrics_listen="},
      dir.path() + "/output");
  ASSERT_TRUE(second.has_value());
  const std::optional<int> code = second->Wait(kExitTimeout);
  if (!code.has_value()) second->Signal(SIGKILL);
  EXPECT_NE(code, std::nullopt) << "a second server serves on a port the first one holds";
  EXPECT_NE(code, 0);
  EXPECT_THAT(second->Output(), HasSubstr("cannot listen"));
}

TEST(ServerBinaryFlagsTest, NonPositiveMaxMessageBytesExitsTwo) {
  ScopedTempDir dir;
  auto process = ChildProcess::Start(RETRY_BUDGET_SERVER_BINARY, {"--max_message_bytes=0"},
                                     dir.path() + "/output");
  ASSERT_TRUE(process.has_value());
  EXPECT_EQ(process->Wait(kExitTimeout), 2);
  EXPECT_THAT(process->Output(), HasSubstr("--max_message_bytes"));
}

TEST(ServerBinaryFlagsTest, ReserveAheadOutsideItsRangeExitsTwoNamingTheFlagAndTheValue) {
  for (const char* value : {"5ms", "2m"}) {
    ScopedTempDir dir;
    auto process = ChildProcess::Start(RETRY_BUDGET_SERVER_BINARY,
                                       {absl::StrCat("--etcd_reserve_ahead=", value)},
                                       dir.path() + "/output");
    ASSERT_TRUE(process.has_value());
    EXPECT_EQ(process->Wait(kExitTimeout), 2) << value;
    EXPECT_THAT(process->Output(), HasSubstr(absl::StrCat("--etcd_reserve_ahead=", value)));
    EXPECT_THAT(process->Output(), HasSubstr("between 10ms and 1m"));
  }
}

}  // namespace
}  // namespace retrybudget::testing
