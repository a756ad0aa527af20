// Any sequence of Sync requests from any instances, with time moving between them: the core
// never crashes, never holds a negative or over-capacity level, and never grants more than its
// tenants' budgets allow:
//
//   granted <= initial + refill * elapsed + credit * successes + returned + reclaimed
//
// (tokens a client returns or never received go back into the bucket and may be granted again).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "server/budget_core.h"

namespace {

constexpr double kCapacity = 20;
constexpr double kRefill = 3;
constexpr double kCredit = 0.5;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  retrybudget::FakeClock clock;
  const absl::Time start = clock.Now();
  retrybudget::CoreOptions options;
  options.clock = &clock;
  options.max_tenants = 8;
  options.max_instances = 8;
  auto* p = options.policy.mutable_default_policy();
  p->set_capacity(kCapacity);
  p->set_refill_per_second(kRefill);
  p->set_success_credit(kCredit);
  auto core = retrybudget::BudgetCore::Create(options);
  if (!core.ok()) std::abort();

  // Input: records of [1 byte: time step in 10 ms][2 bytes: length][length bytes: SyncRequest].
  size_t pos = 0;
  while (pos + 3 <= size) {
    clock.Advance(absl::Milliseconds(10 * data[pos]));
    const size_t len = data[pos + 1] | (static_cast<size_t>(data[pos + 2]) << 8);
    pos += 3;
    if (len > size - pos) break;
    retrybudget::v1::SyncRequest request;
    if (request.ParseFromArray(data + pos, static_cast<int>(len))) {
      auto response = (*core)->Sync(request);
      if (!response.ok() && response.status().message().empty()) std::abort();
    }
    pos += len;
  }

  const double elapsed = absl::ToDoubleSeconds(clock.Now() - start);
  for (const auto& b : (*core)->Snapshot()) {
    if (!(b.tokens() >= -1e-6) || b.tokens() > kCapacity + 1e-6) std::abort();
    const double allowed = kCapacity + kRefill * elapsed + kCredit * b.successes_total() +
                           b.returned_total() + b.reclaimed_total();
    if (static_cast<double>(b.granted_total()) > allowed + 1e-6) std::abort();
  }
  return 0;
}
