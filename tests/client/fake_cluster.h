// Several fake budget servers keyed by address, as a cluster would answer the client: each
// server grants the tenants it owns, names the owner of the others (FAILED_PRECONDITION with
// TenantError.owner), and answers UNAVAILABLE for a tenant whose shard has no owner. A stand-in
// for the cluster server's behaviour in the client's unit tests; the end-to-end tests with real
// servers on etcd live with the cluster tests (tests/cluster).
#ifndef RETRYBUDGET_TESTS_CLIENT_FAKE_CLUSTER_H_
#define RETRYBUDGET_TESTS_CLIENT_FAKE_CLUSTER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "retrybudget/client_testing.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/budget.pb.h"
// The generated mock header has no include guard: take it through client_test_util.h.
#include "tests/client/client_test_util.h"

namespace retrybudget::testing_util {

class FakeCluster {
 public:
  // One Sync as a server received it.
  struct Received {
    std::string address;
    v1::SyncRequest request;
  };

  // Who owns `tenant`: an address, or "" (no owner can grant: UNAVAILABLE).
  void SetOwner(const std::string& tenant, const std::string& address) {
    MutexLock lock(&mu_);
    owner_[tenant] = address;
  }
  // What `address` claims is the owner of `tenant` (a server with a stale view; for loops).
  void SetClaim(const std::string& address, const std::string& tenant, const std::string& owner) {
    MutexLock lock(&mu_);
    claims_[address][tenant] = owner;
  }
  // Sync to `address` fails with UNAVAILABLE (a dead server).
  void SetDown(const std::string& address, bool down) {
    MutexLock lock(&mu_);
    if (down) {
      down_.insert(address);
    } else {
      down_.erase(address);
    }
  }

  // The stub of the server at `address` (the client owns it).
  std::unique_ptr<v1::RetryBudgetService::StubInterface> Stub(const std::string& address) {
    auto stub = std::make_unique<v1::MockRetryBudgetServiceStub>();
    EXPECT_CALL(*stub, Sync(::testing::_, ::testing::_, ::testing::_))
        .WillRepeatedly([this, address](grpc::ClientContext*, const v1::SyncRequest& request,
                                        v1::SyncResponse* response) {
          return Answer(address, request, response);
        });
    return stub;
  }
  OwnerStubFactory Factory() {
    return [this](const std::string& address) { return Stub(address); };
  }

  std::vector<Received> received() {
    MutexLock lock(&mu_);
    return received_;
  }
  // The requests `address` received.
  std::vector<v1::SyncRequest> requests_to(const std::string& address) {
    MutexLock lock(&mu_);
    std::vector<v1::SyncRequest> out;
    for (const Received& r : received_) {
      if (r.address == address) out.push_back(r.request);
    }
    return out;
  }

 private:
  grpc::Status Answer(const std::string& address, const v1::SyncRequest& request,
                      v1::SyncResponse* response) {
    MutexLock lock(&mu_);
    received_.push_back({address, request});
    if (down_.contains(address)) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "down");
    for (const v1::TenantSync& entry : request.tenants()) {
      v1::TenantGrant* grant = response->add_tenants();
      grant->set_tenant(entry.tenant());
      std::string owner = owner_.contains(entry.tenant()) ? owner_[entry.tenant()] : address;
      if (auto c = claims_.find(address);
          c != claims_.end() && c->second.contains(entry.tenant())) {
        owner = c->second[entry.tenant()];
      }
      if (owner.empty()) {
        grant->mutable_error()->set_code(static_cast<int>(grpc::StatusCode::UNAVAILABLE));
        grant->mutable_error()->set_message("shard has no owner");
      } else if (owner != address) {
        grant->mutable_error()->set_code(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
        grant->mutable_error()->set_message("not the owner");
        grant->mutable_error()->set_owner(owner);
      } else {
        grant->set_granted(request.final() ? 0 : 10);
        grant->set_lease_ttl_ms(1000);
        grant->set_next_sync_ms(200);
      }
    }
    return grpc::Status::OK;
  }

  Mutex mu_;
  std::map<std::string, std::string> owner_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::map<std::string, std::string>> claims_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> down_ ABSL_GUARDED_BY(mu_);
  std::vector<Received> received_ ABSL_GUARDED_BY(mu_);
};

}  // namespace retrybudget::testing_util

#endif  // RETRYBUDGET_TESTS_CLIENT_FAKE_CLUSTER_H_
