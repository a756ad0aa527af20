// The fixture of the C++ client's tests against the REAL retry-budget-server process: a server
// started per test on 127.0.0.1:0 (the binary named by RETRYBUDGET_SERVER_BIN, a compile
// definition of the test target), an admin connection to put policies and read budgets, and
// clients made by BudgetClient::Create() as a program makes them.
#ifndef RETRYBUDGET_TESTS_CLIENT_REAL_SERVER_CLIENT_TEST_H_
#define RETRYBUDGET_TESTS_CLIENT_REAL_SERVER_CLIENT_TEST_H_

#include <memory>
#include <string>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tests/support/server_connection.h"
#include "tests/support/test_launcher.h"

namespace retrybudget::testing {

class RealServerClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server =
        ServerUnderTest::Start({.binary = RETRYBUDGET_SERVER_BIN, .flags = {"--log_level=warn"}});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    admin_ = ServerConnection::Create(server_->address(), grpc::InsecureChannelCredentials());
    admin_.wait_for_ready = true;
  }

  void PutPolicy(const std::string& tenant, const v1::BudgetPolicy& policy) {
    const grpc::Status status = admin_.PutPolicy(tenant, policy);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  v1::BudgetStatus GetBudget(const std::string& tenant) {
    v1::BudgetStatus budget;
    const grpc::Status status = admin_.GetBudget(tenant, &budget);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return budget;
  }

  // A client of this test's server with `options` (the defaults, as a new user has them, unless
  // the test sets some); null (after a test failure) if Create() refuses.
  std::unique_ptr<BudgetClient> CreateClient(ClientOptions options = {}) {
    options.target = server_->address();
    absl::StatusOr<std::unique_ptr<BudgetClient>> client = BudgetClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<ServerUnderTest> server_;
  ServerConnection admin_;
};

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_CLIENT_REAL_SERVER_CLIENT_TEST_H_
