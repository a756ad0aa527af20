// A BudgetClient over a gMock stub on a FakeClock, for the client tests.
#ifndef RETRYBUDGET_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
#define RETRYBUDGET_TESTS_CLIENT_CLIENT_TEST_UTIL_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include <map>
#include <mutex>
#include <string>

#include <grpcpp/test/client_context_test_peer.h>

#include "retrybudget/mutex.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "retrybudget/client.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/clock.h"
#include "retrybudget/v1/budget.pb.h"
#include "retrybudget/v1/budget_mock.grpc.pb.h"

namespace retrybudget::testing_util {

// What the fake server does with one Sync.
using SyncHandler = std::function<grpc::Status(const v1::SyncRequest&, v1::SyncResponse*)>;

// Answers every tenant of `request` with `granted` tokens.
inline grpc::Status GrantAll(const v1::SyncRequest& request, v1::SyncResponse* response,
                             uint64_t granted, int64_t lease_ttl_ms = 5000,
                             int64_t next_sync_ms = 200) {
  for (const v1::TenantSync& entry : request.tenants()) {
    v1::TenantGrant* grant = response->add_tenants();
    grant->set_tenant(entry.tenant());
    grant->set_granted(request.final() ? 0 : granted);
    grant->set_lease_ttl_ms(lease_ttl_ms);
    grant->set_next_sync_ms(next_sync_ms);
  }
  return grpc::Status::OK;
}

inline SyncHandler Granting(uint64_t granted, int64_t lease_ttl_ms = 5000,
                            int64_t next_sync_ms = 200) {
  return [=](const v1::SyncRequest& request, v1::SyncResponse* response) {
    return GrantAll(request, response, granted, lease_ttl_ms, next_sync_ms);
  };
}

inline SyncHandler Failing(grpc::StatusCode code) {
  return [=](const v1::SyncRequest&, v1::SyncResponse*) {
    return grpc::Status(code, "injected failure");
  };
}

// Answers every tenant with `granted` tokens and a SafeShare.
inline SyncHandler GrantingWithShare(uint64_t granted, double share_capacity,
                                     double share_refill_per_second, int64_t lease_ttl_ms = 5000,
                                     int64_t next_sync_ms = 200, double share_success_credit = 0) {
  return [=](const v1::SyncRequest& request, v1::SyncResponse* response) {
    GrantAll(request, response, granted, lease_ttl_ms, next_sync_ms);
    for (v1::TenantGrant& grant : *response->mutable_tenants()) {
      grant.mutable_safe_share()->set_capacity(share_capacity);
      grant.mutable_safe_share()->set_refill_per_second(share_refill_per_second);
      grant.mutable_safe_share()->set_success_credit(share_success_credit);
    }
    return grpc::Status::OK;
  };
}

// The checks the real server makes on every tenant entry before applying it (a request failing
// them is refused with INVALID_ARGUMENT): fallback_spent <= retries_spent, retries_refunded <=
// retries_spent, fallback_refunded <= fallback_spent and <= retries_refunded,
// (retries_spent - fallback_spent) - (retries_refunded - fallback_refunded) + tokens_returned
// <= tokens_received, and no cumulative counter lower than in an earlier request of the
// instance. Returns what is wrong, or "".
class ServerRules {
 public:
  std::string Check(const v1::SyncRequest& request) {
    std::string problems;
    for (const v1::TenantSync& t : request.tenants()) {
      const std::string where = absl::StrCat("seq ", request.seq(), " tenant ", t.tenant(), ": ");
      if (t.fallback_spent() > t.retries_spent()) {
        absl::StrAppend(&problems, where, "fallback_spent ", t.fallback_spent(),
                        " > retries_spent ", t.retries_spent(), "; ");
      } else if (t.retries_refunded() > t.retries_spent()) {
        absl::StrAppend(&problems, where, "retries_refunded ", t.retries_refunded(),
                        " > retries_spent ", t.retries_spent(), "; ");
      } else if (t.fallback_refunded() > t.fallback_spent() ||
                 t.fallback_refunded() > t.retries_refunded()) {
        absl::StrAppend(&problems, where, "fallback_refunded ", t.fallback_refunded(),
                        " > fallback_spent ", t.fallback_spent(), " or retries_refunded ",
                        t.retries_refunded(), "; ");
      } else if (t.successes_credited_locally() > t.successes()) {
        absl::StrAppend(&problems, where, "successes_credited_locally ",
                        t.successes_credited_locally(), " > successes ", t.successes(), "; ");
      } else if (t.requests_credited_locally() > t.requests()) {
        absl::StrAppend(&problems, where, "requests_credited_locally ",
                        t.requests_credited_locally(), " > requests ", t.requests(), "; ");
      } else if (t.retries_allowed() > t.retries_spent()) {
        absl::StrAppend(&problems, where, "retries_allowed ", t.retries_allowed(),
                        " > retries_spent ", t.retries_spent(), "; ");
      } else if ((t.retries_spent() - t.fallback_spent()) + t.tokens_returned() >
                 t.tokens_received() + (t.retries_refunded() - t.fallback_refunded())) {
        // Both differences are >= 0 by the checks above; written without a subtraction that
        // could wrap.
        absl::StrAppend(&problems, where, "leased spent ", t.retries_spent() - t.fallback_spent(),
                        " - leased refunded ", t.retries_refunded() - t.fallback_refunded(),
                        " + returned ", t.tokens_returned(), " > received ",
                        t.tokens_received(), "; ");
      }
      v1::TenantSync& last = last_[t.tenant()];
      auto backwards = [&](const char* name, uint64_t before, uint64_t now) {
        if (now < before) {
          absl::StrAppend(&problems, where, name, " went back from ", before, " to ", now, "; ");
        }
      };
      backwards("successes", last.successes(), t.successes());
      backwards("retries_spent", last.retries_spent(), t.retries_spent());
      backwards("retries_denied", last.retries_denied(), t.retries_denied());
      backwards("tokens_returned", last.tokens_returned(), t.tokens_returned());
      backwards("tokens_received", last.tokens_received(), t.tokens_received());
      backwards("fallback_spent", last.fallback_spent(), t.fallback_spent());
      backwards("retries_refunded", last.retries_refunded(), t.retries_refunded());
      backwards("fallback_refunded", last.fallback_refunded(), t.fallback_refunded());
      backwards("successes_credited_locally", last.successes_credited_locally(),
                t.successes_credited_locally());
      backwards("requests", last.requests(), t.requests());
      backwards("requests_credited_locally", last.requests_credited_locally(),
                t.requests_credited_locally());
      backwards("shadow_denied", last.shadow_denied(), t.shadow_denied());
      backwards("retries_allowed", last.retries_allowed(), t.retries_allowed());
      last = t;
    }
    return problems;
  }

 private:
  absl::flat_hash_map<std::string, v1::TenantSync> last_;
};

// Owns a FakeClock, a mock stub (through the client) and a testing client. Every Sync is
// recorded (with the metadata the client set on its context), checked against ServerRules
// (violations fail the test when the harness is destroyed) and answered by `handler`, which
// tests swap between steps.
class ClientHarness {
 public:
  explicit ClientHarness(ClientOptions options = DefaultOptions(),
                         bool start_refresher_thread = false) {
    auto stub = std::make_unique<v1::MockRetryBudgetServiceStub>();
    EXPECT_CALL(*stub, Sync(::testing::_, ::testing::_, ::testing::_))
        .WillRepeatedly([this](grpc::ClientContext* context, const v1::SyncRequest& request,
                               v1::SyncResponse* response) {
          SyncHandler handler;
          {
            MutexLock lock(&mu_);
            requests_.push_back(request);
            metadata_.push_back(
                grpc::testing::ClientContextTestPeer(context).GetSendInitialMetadata());
            timeouts_.push_back(
                absl::FromChrono(context->deadline() - std::chrono::system_clock::now()));
            if (std::string problems = rules_.Check(request); !problems.empty()) {
              violations_.push_back(problems);
            }
            handler = handler_;
          }
          return handler(request, response);
        });
    if (options.clock == nullptr) options.clock = &clock_;
    client_ = CreateBudgetClientForTesting(std::move(options), std::move(stub),
                                           start_refresher_thread)
                  .value();
  }

  static ClientOptions DefaultOptions() {
    ClientOptions options;
    options.instance_id = "test-instance";
    options.refresh_period = absl::Milliseconds(200);
    options.min_sync_interval = absl::Milliseconds(5);
    options.lease_burst = 2;
    return options;
  }

  void set_handler(SyncHandler handler) {
    MutexLock lock(&mu_);
    handler_ = std::move(handler);
  }

  std::vector<v1::SyncRequest> requests() {
    MutexLock lock(&mu_);
    return requests_;
  }
  size_t sync_count() {
    MutexLock lock(&mu_);
    return requests_.size();
  }
  v1::SyncRequest last_request() {
    MutexLock lock(&mu_);
    return requests_.empty() ? v1::SyncRequest() : requests_.back();
  }

  // The metadata the client sent with the last Sync.
  std::multimap<std::string, std::string> last_metadata() {
    MutexLock lock(&mu_);
    return metadata_.empty() ? std::multimap<std::string, std::string>() : metadata_.back();
  }
  // How long the last Sync had left before its deadline when the stub received it.
  absl::Duration last_timeout() {
    MutexLock lock(&mu_);
    return timeouts_.empty() ? absl::ZeroDuration() : timeouts_.back();
  }
  // Requests the real server would have refused (see ServerRules).
  std::vector<std::string> violations() {
    MutexLock lock(&mu_);
    return violations_;
  }

  FakeClock& clock() { return clock_; }
  TestingBudgetClient& client() { return *client_; }
  TenantBudget* Tenant(absl::string_view name) { return client_->Tenant(name).value(); }

  // Destroys the client (a final Sync goes through the handler) before the harness members.
  void DestroyClient() { client_.reset(); }
  ~ClientHarness() {
    DestroyClient();
    EXPECT_THAT(violations(), ::testing::IsEmpty()) << "requests the server would refuse";
  }

 private:
  FakeClock clock_;
  // retrybudget::Mutex rather than absl::Mutex: visible to TSan (see retrybudget/mutex.h).
  Mutex mu_;
  std::vector<v1::SyncRequest> requests_ ABSL_GUARDED_BY(mu_);
  std::vector<std::multimap<std::string, std::string>> metadata_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Duration> timeouts_ ABSL_GUARDED_BY(mu_);
  ServerRules rules_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  SyncHandler handler_ ABSL_GUARDED_BY(mu_) = Granting(0);
  std::unique_ptr<TestingBudgetClient> client_;
};

}  // namespace retrybudget::testing_util

#endif  // RETRYBUDGET_TESTS_CLIENT_CLIENT_TEST_UTIL_H_
