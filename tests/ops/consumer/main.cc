// A minimal worker using the installed package: leases from the budget server given on the
// command line, spends one retry, reports a success, shuts down cleanly.
//
//   consumer HOST:PORT     exit 0 and "consumer: ok" on success
#include <chrono>
#include <iostream>
#include <thread>

#include "absl/status/status.h"
#include "retrybudget/client.h"
#include "retrybudget/retry.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer HOST:PORT\n";
    return 2;
  }
  retrybudget::ClientOptions options;
  options.target = argv[1];
  auto client = retrybudget::BudgetClient::Create(options);
  if (!client.ok()) {
    std::cerr << "consumer: " << client.status() << "\n";
    return 1;
  }
  auto budget = (*client)->Tenant("consumer");
  if (!budget.ok()) {
    std::cerr << "consumer: " << budget.status() << "\n";
    return 1;
  }
  // The first TryAcquire() wakes the refresher; a lease arrives within one round trip.
  bool acquired = false;
  for (int i = 0; i < 200 && !acquired; ++i) {
    acquired = (*budget)->TryAcquire();
    if (!acquired) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  if (!acquired) {
    std::cerr << "consumer: no retry token within 5 s\n";
    return 1;
  }
  (*budget)->RecordSuccess();
  // retrybudget::retry links too: the budget-exhausted mark is recognisable.
  if (retrybudget::IsBudgetExhausted(absl::OkStatus())) return 1;
  if (absl::Status s = (*client)->Shutdown(); !s.ok()) {
    std::cerr << "consumer: shutdown: " << s << "\n";
    return 1;
  }
  const retrybudget::TenantStats stats = (*budget)->Stats();
  std::cout << "consumer: ok (retries_allowed " << stats.retries_allowed << ", successes "
            << stats.successes << ")\n";
  return 0;
}
