// The standard gRPC services of the real server binary: grpc.health.v1 says SERVING while it
// serves and NOT_SERVING as soon as a clean shutdown starts (while an RPC is still in flight),
// and server reflection lists the budget services.
#include <signal.h>

#include <chrono>
#include <future>
#include <set>
#include <string>

#include "absl/time/clock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/ops/ops_test_util.h"

namespace retrybudget::testing {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

std::chrono::system_clock::time_point In(absl::Duration d) {
  return absl::ToChronoTime(absl::Now() + d);
}

grpc::Status Check(grpc::health::v1::Health::Stub& health, const std::string& service,
                   HealthCheckResponse* response) {
  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(5)));
  HealthCheckRequest request;
  request.set_service(service);
  return health.Check(&context, request, response);
}

TEST(HealthTest, NotServingDuringCleanShutdown) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(
      RETRY_BUDGET_SERVER_BINARY, {"--testonly_sync_response_delay=4s", "--shutdown_grace=10s"});
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);

  for (const std::string service :
       {"", "retrybudget.v1.RetryBudgetService", "retrybudget.v1.BudgetAdminService"}) {
    HealthCheckResponse response;
    const grpc::Status status = Check(*health, service, &response);
    ASSERT_TRUE(status.ok()) << service << ": " << status.error_message();
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << "service \"" << service << "\"";
  }

  // A Sync held in flight by the response delay.
  auto budget = v1::RetryBudgetService::NewStub(channel);
  std::future<grpc::Status> in_flight = std::async(std::launch::async, [&] {
    grpc::ClientContext context;
    context.set_deadline(In(absl::Seconds(20)));
    v1::SyncRequest request;
    request.set_instance_id("health-test");
    request.set_seq(1);
    request.add_tenants()->set_tenant("health");
    request.mutable_tenants(0)->set_want(1);
    v1::SyncResponse response;
    return budget->Sync(&context, request, &response);
  });
  // Let the Sync reach the server before the signal.
  absl::SleepFor(absl::Milliseconds(500));
  server->process->Signal(SIGTERM);

  // While the Sync drains, health says NOT_SERVING for the server and both services.
  bool seen_not_serving = false;
  const absl::Time deadline = absl::Now() + absl::Seconds(3);
  while (!seen_not_serving && absl::Now() < deadline) {
    HealthCheckResponse response;
    if (Check(*health, "", &response).ok() &&
        response.status() == HealthCheckResponse::NOT_SERVING) {
      seen_not_serving = true;
      for (const std::string service :
           {"retrybudget.v1.RetryBudgetService", "retrybudget.v1.BudgetAdminService"}) {
        HealthCheckResponse r;
        ASSERT_TRUE(Check(*health, service, &r).ok());
        EXPECT_EQ(r.status(), HealthCheckResponse::NOT_SERVING) << service;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_TRUE(seen_not_serving) << "health never said NOT_SERVING during the drain";
  // The drain really was in progress: the held Sync still completes.
  EXPECT_TRUE(in_flight.get().ok());
  EXPECT_EQ(server->process->WaitForExit(absl::Seconds(20)), 0) << server->process->Log();
}

TEST(ReflectionTest, ListsTheBudgetServicesAndHealth) {
  std::unique_ptr<OpsServer> server = OpsServer::Start(RETRY_BUDGET_SERVER_BINARY);
  ASSERT_NE(server, nullptr);
  auto channel = grpc::CreateChannel(server->address(), grpc::InsecureChannelCredentials());
  auto reflection = grpc::reflection::v1alpha::ServerReflection::NewStub(channel);

  grpc::ClientContext context;
  context.set_deadline(In(absl::Seconds(10)));
  auto stream = reflection->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));

  // The file declaring the budget services can be fetched too (what grpcurl needs).
  grpc::reflection::v1alpha::ServerReflectionRequest by_symbol;
  by_symbol.set_file_containing_symbol("retrybudget.v1.BudgetAdminService");
  ASSERT_TRUE(stream->Write(by_symbol));
  stream->WritesDone();

  grpc::reflection::v1alpha::ServerReflectionResponse list;
  ASSERT_TRUE(stream->Read(&list));
  std::set<std::string> services;
  for (const auto& s : list.list_services_response().service()) services.insert(s.name());
  EXPECT_TRUE(services.contains("retrybudget.v1.RetryBudgetService"));
  EXPECT_TRUE(services.contains("retrybudget.v1.BudgetAdminService"));
  EXPECT_TRUE(services.contains("grpc.health.v1.Health"));
  EXPECT_TRUE(services.contains("grpc.reflection.v1alpha.ServerReflection"));

  grpc::reflection::v1alpha::ServerReflectionResponse file;
  ASSERT_TRUE(stream->Read(&file));
  ASSERT_TRUE(file.has_file_descriptor_response())
      << file.error_response().error_message();
  EXPECT_GE(file.file_descriptor_response().file_descriptor_proto_size(), 1);
  grpc::reflection::v1alpha::ServerReflectionResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  EXPECT_TRUE(stream->Finish().ok());
}

}  // namespace
}  // namespace retrybudget::testing
