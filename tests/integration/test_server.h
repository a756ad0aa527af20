// The real budget server (BudgetCore + services + gRPC on 127.0.0.1, port 0) started in the test
// process, with a FakeClock that only the test moves, and stubs connected to it.
#ifndef RETRYBUDGET_TESTS_INTEGRATION_TEST_SERVER_H_
#define RETRYBUDGET_TESTS_INTEGRATION_TEST_SERVER_H_

#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "google/protobuf/text_format.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "server/budget_core.h"
#include "server/budget_server.h"
#include "tests/support/server_connection.h"

namespace retrybudget::testing {

struct TestServerOptions {
  v1::PolicyConfig policy = {};
  int max_message_bytes = kDefaultMaxMessageBytes;
  // Use the real clock instead of the fake one (for tests with real clients that wait).
  bool real_clock = false;
  // Hooks and test-only behaviour of the services (the core is set by Start()).
  RequestAuthorizer* authorizer = nullptr;
  ServiceMetrics* metrics = nullptr;
  absl::Duration sync_response_delay = absl::ZeroDuration();
};

// Not thread-safe to construct or destroy; the stubs and the clock are thread-safe.
class TestServer {
 public:
  // Fails the current test (and returns null) if the server does not start.
  static std::unique_ptr<TestServer> Start(TestServerOptions options = {});
  ~TestServer();

  // Unary calls with a 10 s deadline.
  grpc::Status Sync(const v1::SyncRequest& request, v1::SyncResponse* response);
  grpc::Status GetBudget(absl::string_view tenant, v1::BudgetStatus* budget);
  grpc::Status ListBudgets(const v1::ListBudgetsRequest& request,
                           v1::ListBudgetsResponse* response);
  grpc::Status PutPolicy(absl::string_view tenant, const v1::BudgetPolicy& policy,
                         v1::BudgetStatus* budget);
  grpc::Status DeleteBudget(absl::string_view tenant);

  FakeClock& clock() { return clock_; }
  BudgetCore& core() { return *core_; }
  BudgetServer& server() { return *server_; }
  // "127.0.0.1:<port>".
  const std::string& address() const { return server_->address(); }
  v1::RetryBudgetService::Stub& budget_stub() { return *connection_.budget; }

 private:
  TestServer() = default;

  FakeClock clock_;
  std::unique_ptr<BudgetCore> core_;
  std::unique_ptr<BudgetServer> server_;
  ServerConnection connection_;  // plaintext, no token, 10 s deadline
};

// Parses a message from protobuf text format; aborts on a typo in the test.
template <typename Message>
Message Parse(absl::string_view text) {
  Message message;
  if (!google::protobuf::TextFormat::ParseFromString(std::string(text), &message)) abort();
  return message;
}

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_INTEGRATION_TEST_SERVER_H_
