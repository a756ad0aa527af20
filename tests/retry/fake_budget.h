// A TenantBudget for tests: a plain counter of tokens, no server, no lease. Thread-safe.
#ifndef RETRYBUDGET_TESTS_RETRY_FAKE_BUDGET_H_
#define RETRYBUDGET_TESTS_RETRY_FAKE_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "retrybudget/client.h"

namespace retrybudget::testing {

class FakeBudget : public TenantBudget {
 public:
  explicit FakeBudget(int64_t tokens = 1'000'000) : tokens_(tokens) {}

  using TenantBudget::Refund;
  using TenantBudget::TryAcquire;

  // All or nothing, as the client's.
  bool TryAcquire(uint32_t cost) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      costs_asked_.push_back(cost);
    }
    int64_t have = tokens_.load();
    while (have >= static_cast<int64_t>(cost)) {
      if (tokens_.compare_exchange_weak(have, have - cost)) {
        ++acquired;
        return true;
      }
    }
    ++denied;
    return false;
  }
  void Refund(uint32_t cost) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      costs_refunded_.push_back(cost);
    }
    ++refunded;
    tokens_ += cost;
  }
  void RecordRequest() override { ++requests; }
  void RecordSuccess() override { ++successes; }
  const std::string& tenant() const override { return tenant_; }
  TenantStats Stats() const override {
    TenantStats s;
    s.successes = successes.load();
    s.requests = requests.load();
    s.retries_allowed = acquired.load();
    s.retries_denied = denied.load();
    s.tokens_held = tokens_.load();
    return s;
  }

  int64_t tokens() const { return tokens_.load(); }
  // Retries taken and not given back: retries actually sent.
  int64_t spent() const { return acquired.load() - refunded.load(); }
  // The cost of every TryAcquire() / Refund() call, in call order.
  std::vector<uint32_t> costs_asked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return costs_asked_;
  }
  std::vector<uint32_t> costs_refunded() const {
    std::lock_guard<std::mutex> lock(mu_);
    return costs_refunded_;
  }

  std::atomic<int64_t> acquired{0};
  std::atomic<int64_t> denied{0};
  std::atomic<int64_t> refunded{0};
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> successes{0};

 private:
  std::atomic<int64_t> tokens_;
  const std::string tenant_ = "test-tenant";
  mutable std::mutex mu_;
  std::vector<uint32_t> costs_asked_;
  std::vector<uint32_t> costs_refunded_;
};

}  // namespace retrybudget::testing

#endif  // RETRYBUDGET_TESTS_RETRY_FAKE_BUDGET_H_
