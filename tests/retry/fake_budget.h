// A TenantBudget for tests: a plain counter of tokens, no server, no lease. Thread-safe.
#ifndef RETRYBUDGET_TESTS_RETRY_FAKE_BUDGET_H_
#define RETRYBUDGET_TESTS_RETRY_FAKE_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "retrybudget/client.h"

namespace retrybudget::testing {

class FakeBudget : public TenantBudget {
 public:
  explicit FakeBudget(int64_t tokens = 1'000'000) : tokens_(tokens) {}

  bool TryAcquire() override {
    int64_t have = tokens_.load();
    while (have > 0) {
      if (tokens_.compare_exchange_weak(have, have - 1)) {
        ++acquired;
        return true;
      }
    }
    ++denied;
    return false;
  }
  void Refund() override {
    ++refunded;
    ++tokens_;
  }
  void RecordSuccess() override { ++successes; }
  const std::string& tenant() const override { return tenant_; }
  TenantStats Stats() const override {
    TenantStats s;
    s.successes = successes.load();
    s.retries_allowed = acquired.load();
    s.retries_denied = denied.load();
    s.tokens_held = tokens_.load();
    return s;
  }

  int64_t tokens() const { return tokens_.load(); }
  // Tokens taken and not given back: retries actually spent.
  int64_t spent() const { return acquired.load() - refunded.load(); }

  std::atomic<int64_t> acquired{0};
  std::atomic<int64_t> denied{0};
  std::atomic<int64_t> refunded{0};
  std::atomic<int64_t> successes{0};

 private:
  std::atomic<int64_t> tokens_;
  const std::string tenant_ = "test-tenant";
};

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_RETRY_FAKE_BUDGET_H_
