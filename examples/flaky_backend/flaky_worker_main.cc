// flaky-worker: a worker that calls the flaky backend through the retry helper, with its
// retries paid from the fleet's shared budget (retry-budget-server).
//
//   retry-budget-server --port=50051 &
//   flaky-backend --address=127.0.0.1:50061 --failure_probability=0.4 &
//   flaky-worker --budget_server=127.0.0.1:50051 --backend=127.0.0.1:50061 --calls=200
//
// Each call is one logical call: the first attempt is free, every retry takes a token from the
// tenant's budget; a denied retry fails the call at once (reported as "budget exhausted").
// Ctrl-C cancels the call in flight (its RPC or its backoff) immediately.
#include <pthread.h>

#include <csignal>
#include <cstdio>
#include <ctime>
#include <stop_token>
#include <string>
#include <thread>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "flaky.grpc.pb.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"
#include "retrybudget/retry_grpc.h"

ABSL_FLAG(std::string, budget_server, "127.0.0.1:50051", "retry-budget-server address");
ABSL_FLAG(std::string, backend, "127.0.0.1:50061", "flaky-backend address");
ABSL_FLAG(std::string, tenant, "flaky-echo", "Budget tenant the retries are charged to");
ABSL_FLAG(int, calls, 100, "Logical calls to make");
ABSL_FLAG(int, interval_ms, 10, "Pause between calls");
ABSL_FLAG(int, deadline_ms, 2000, "Overall deadline of one logical call");
ABSL_FLAG(int, per_attempt_timeout_ms, 0, "Timeout of one attempt (0: none)");
ABSL_FLAG(int, max_attempts, 4, "Most attempts per logical call, the first included");
ABSL_FLAG(int, initial_backoff_ms, 20, "Backoff ceiling before the first retry");
ABSL_FLAG(int, max_backoff_ms, 500, "Largest backoff ceiling");

namespace {

using retrybudget::examples::EchoReply;
using retrybudget::examples::EchoRequest;
using retrybudget::examples::FlakyEcho;

int Run() {
  // SIGINT/SIGTERM are taken by a watcher thread that requests stop: the call in flight ends at
  // once (its RPC is cancelled or its backoff interrupted) and no further call starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::stop_source cancel;
  std::jthread watcher([&](std::stop_token done) {
    const timespec tick{0, 100'000'000};
    while (!done.stop_requested()) {
      if (sigtimedwait(&signals, nullptr, &tick) > 0) {
        cancel.request_stop();
        return;
      }
    }
  });

  retrybudget::ClientOptions client_options;
  client_options.target = absl::GetFlag(FLAGS_budget_server);
  auto client = retrybudget::BudgetClient::Create(client_options);
  if (!client.ok()) {
    std::fprintf(stderr, "flaky-worker: %s\n", client.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<retrybudget::TenantBudget*> budget = (*client)->Tenant(absl::GetFlag(FLAGS_tenant));
  if (!budget.ok()) {
    std::fprintf(stderr, "flaky-worker: %s\n", budget.status().ToString().c_str());
    return 1;
  }

  grpc::ChannelArguments args;
  retrybudget::DisableGrpcBuiltInRetries(args);  // one retry layer: ours, paid from the budget
  std::unique_ptr<FlakyEcho::Stub> stub = FlakyEcho::NewStub(grpc::CreateCustomChannel(
      absl::GetFlag(FLAGS_backend), grpc::InsecureChannelCredentials(), args));

  retrybudget::RetryPolicy policy;
  policy.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  policy.initial_backoff = absl::Milliseconds(absl::GetFlag(FLAGS_initial_backoff_ms));
  policy.max_backoff = absl::Milliseconds(absl::GetFlag(FLAGS_max_backoff_ms));
  if (absl::GetFlag(FLAGS_per_attempt_timeout_ms) > 0) {
    policy.per_attempt_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_per_attempt_timeout_ms));
  }
  if (absl::Status valid = retrybudget::ValidateRetryPolicy(policy); !valid.ok()) {
    std::fprintf(stderr, "flaky-worker: %s\n", valid.ToString().c_str());
    return 2;
  }

  int ok = 0, exhausted = 0, failed = 0, cancelled = 0, attempts = 0;
  const int calls = absl::GetFlag(FLAGS_calls);
  for (int i = 0; i < calls && !cancel.stop_requested(); ++i) {
    retrybudget::CallControl control;
    control.stop = cancel.get_token();
    control.deadline = absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms));
    EchoRequest request;
    request.set_message(absl::StrCat("call ", i));
    absl::StatusOr<EchoReply> reply = retrybudget::RetryUnary(
        **budget, policy, control, *stub, &FlakyEcho::Stub::Echo, request);
    if (reply.ok()) {
      ++ok;
      attempts += static_cast<int>(reply->attempts_seen());
    } else if (retrybudget::IsBudgetExhausted(reply.status())) {
      ++exhausted;  // the fleet's budget said no: shed this call instead of hammering
    } else if (reply.status().code() == absl::StatusCode::kCancelled) {
      ++cancelled;
    } else {
      ++failed;
    }
    if (!reply.ok()) {
      std::printf("call %d: %s%s\n", i, reply.status().ToString().c_str(),
                  retrybudget::IsBudgetExhausted(reply.status()) ? " [budget exhausted]" : "");
    }
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_interval_ms)));
  }

  const retrybudget::TenantStats stats = (*budget)->Stats();
  std::printf(
      "flaky-worker: ok=%d (in %d attempts) failed=%d budget_exhausted=%d cancelled=%d | "
      "budget: retries_allowed=%llu retries_denied=%llu successes=%llu\n",
      ok, attempts, failed, exhausted, cancelled,
      static_cast<unsigned long long>(stats.retries_allowed),
      static_cast<unsigned long long>(stats.retries_denied),
      static_cast<unsigned long long>(stats.successes));
  if (absl::Status s = (*client)->Shutdown(); !s.ok()) {
    std::fprintf(stderr, "flaky-worker: final sync: %s\n", s.ToString().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return Run();
}
