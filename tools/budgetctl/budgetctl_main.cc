// budgetctl: operate the budgets of a retry-budget-server through its admin API.
//
//   budgetctl list [--json]
//   budgetctl get TENANT [--json]
//   budgetctl put TENANT [--capacity=N] [--refill=N] [--credit=N] [--initial=N] [--lease-ttl-ms=N]
//                        [--retry-ratio=R] [--min-retries-per-second=F] [--ttl-ms=N]
//                        [--mode=enforce|shadow] [--only]
//   budgetctl mode TENANT enforce|shadow
//   budgetctl delete TENANT
//   budgetctl watch TENANT [--interval=1s] [--count=N]
//
// with --server, --token (or $RETRY_BUDGET_TOKEN), --tls_ca [--tls_cert --tls_key], --timeout.
// Exit codes: 0 ok, 1 the RPC was refused or failed, 2 bad command line.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "tools/budgetctl/budgetctl_commands.h"
#include "tools/budgetctl/budgetctl_flags.h"

namespace {

std::atomic<bool> g_stop{false};

extern "C" void OnInterrupt(int) { g_stop.store(true); }

}  // namespace

int main(int argc, char** argv) {
  using namespace retrybudget::budgetctl;  // NOLINT: a main of a few lines
  const std::vector<std::string> args(argv + 1, argv + argc);
  absl::StatusOr<Invocation> inv = ParseInvocation(args, [](const char* name) {
    return std::getenv(name);
  });
  if (!inv.ok()) {
    std::cerr << "budgetctl: " << inv.status().message() << "\n\n" << Usage();
    return kExitUsage;
  }
  if (inv->command == Command::kHelp) {
    std::cout << Usage();
    return kExitOk;
  }
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      ChannelCredentialsFor(inv->connection);
  if (!credentials.ok()) {
    std::cerr << "budgetctl: " << credentials.status().message() << "\n";
    return kExitUsage;
  }
  auto channel = grpc::CreateChannel(inv->connection.server, *credentials);
  auto stub = retrybudget::v1::BudgetAdminService::NewStub(channel);

  // Ctrl-C ends `watch` cleanly (exit 0); other commands are short RPCs.
  struct sigaction action = {};
  action.sa_handler = OnInterrupt;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  Commands commands(*stub, inv->connection, std::cout, std::cerr);
  return commands.Run(*inv, g_stop);
}
