// Any bytes as a policy file: the parser never crashes, and whatever it accepts the core
// accepts too (one validation, not two that can disagree).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/budget_core.h"
#include "server/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = retrybudget::ParsePolicyConfig(text);
  if (!config.ok()) {
    if (config.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  retrybudget::FakeClock clock;
  retrybudget::CoreOptions options;
  options.policy = *config;
  options.clock = &clock;
  auto core = retrybudget::BudgetCore::Create(options);
  if (!core.ok()) std::abort();
  return 0;
}
