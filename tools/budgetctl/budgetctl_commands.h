// budgetctl's commands over the admin API (BudgetAdminService), and how they print.
//
//   auto stub = v1::BudgetAdminService::NewStub(channel);
//   Commands commands(*stub, invocation.connection, std::cout, std::cerr);
//   int exit_code = commands.Run(invocation, stop);
#ifndef RETRYBUDGET_TOOLS_BUDGETCTL_BUDGETCTL_COMMANDS_H_
#define RETRYBUDGET_TOOLS_BUDGETCTL_BUDGETCTL_COMMANDS_H_

#include <atomic>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tools/admin/owner_following_call.h"
#include "tools/budgetctl/budgetctl_flags.h"

namespace retrybudget::budgetctl {

// The channel credentials `connection` asks for: TLS when tls_ca is set (with a client
// certificate when tls_cert/tls_key are), insecure otherwise. INVALID_ARGUMENT naming the file
// when one cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentialsFor(
    const Connection& connection);

// The budgets as an aligned table, one row per budget, with a header line.
std::string FormatTable(const std::vector<v1::BudgetStatus>& budgets);

// One budget as "name: value" lines.
std::string FormatBudget(const v1::BudgetStatus& budget);

// A message as one line of JSON (proto3 JSON mapping, field names as in budget.proto).
std::string ToJson(const google::protobuf::Message& message);

// Not thread-safe. Prints results to `out`, errors to `err`. The calls about one tenant (get,
// put, mode, delete, watch) follow the tenant's owner in cluster mode (tools/admin/
// owner_following_call.h) through stubs from `owner_stubs` (null: channels to the owner with
// the credentials `connection` asks for), and wait out UNAVAILABLE for up to --timeout.
class Commands {
 public:
  Commands(v1::BudgetAdminService::StubInterface& stub, Connection connection, std::ostream& out,
           std::ostream& err, admin::AdminStubFactory owner_stubs = nullptr);

  // Runs inv.command; returns the exit code (kExitOk or kExitRpcFailed). `stop` ends a watch
  // (set by the SIGINT handler).
  int Run(const Invocation& inv, const std::atomic<bool>& stop);

 private:
  int List(const Invocation& inv);
  int Shards(const Invocation& inv);
  int Get(const Invocation& inv);
  int Put(const Invocation& inv);
  int SetMode(const Invocation& inv);
  // PutPolicy(inv.tenant, policy, mask), following the owner; prints the outcome.
  int PutPolicy(const Invocation& inv, const v1::BudgetPolicy& policy,
                const google::protobuf::FieldMask& mask);
  int Delete(const Invocation& inv);
  int Watch(const Invocation& inv, const std::atomic<bool>& stop);

  // A context with the deadline and the bearer token.
  std::unique_ptr<grpc::ClientContext> NewContext() const;
  // One call about one tenant, following its owner (see the class comment).
  grpc::Status CallOwner(const admin::AdminAttempt& attempt);
  // Prints "budgetctl: RPC(args) failed: CODE: message" (and a hint for auth errors).
  int Failed(const std::string& what, const grpc::Status& status);

  v1::BudgetAdminService::StubInterface& stub_;
  const Connection connection_;
  admin::AdminStubFactory owner_stubs_;
  std::ostream& out_;
  std::ostream& err_;
};

}  // namespace retrybudget::budgetctl

#endif  // RETRYBUDGET_TOOLS_BUDGETCTL_BUDGETCTL_COMMANDS_H_
