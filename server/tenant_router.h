// Which tenants this server may grant from, in cluster mode (many servers sharing the tenants
// through etcd, DESIGN.md "Many servers (etcd)"), and where their reservations are made
// durable. The core asks it per tenant entry; a single server has none (CoreOptions::router is
// null) and its hot path is unchanged. Keeps the core free of etcd: the implementation is
// cluster/ cluster_router.h.
#ifndef RETRYBUDGET_SERVER_TENANT_ROUTER_H_
#define RETRYBUDGET_SERVER_TENANT_ROUTER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "retrybudget/v1/budget.pb.h"
#include "server/durable_store.h"

namespace retrybudget {

// Why a tenant entry is refused, as TenantError carries it.
struct TenantRefusal {
  int32_t code = 0;  // google.rpc.Code: FAILED_PRECONDITION (owner set) or UNAVAILABLE
  std::string message;
  std::string owner;  // the owner's advertise address with FAILED_PRECONDITION
};

// Thread-safe.
class TenantRouter {
 public:
  virtual ~TenantRouter() = default;

  // True when this server owns `tenant`'s shard, has loaded its state, and is surely alive at
  // `now`: it may grant from the tenant. Cheap (called twice per tenant entry of a Sync).
  virtual bool MayServe(absl::string_view tenant, absl::Time now) const = 0;
  // Why MayServe() is false.
  virtual TenantRefusal Refusal(absl::string_view tenant, absl::Time now) const = 0;

  // As DurableStore::ReserveAhead: makes "`tenant` may grant up to `grant_limit`" durable off
  // the caller's thread, then calls `done` (with an error if it could not be written). Never
  // blocks on I/O.
  virtual void ReserveAhead(absl::string_view tenant, uint64_t grant_limit,
                            DurableStore::ReservedCallback done) = 0;
  // Blocks until every ReserveAhead made before the call is done.
  virtual void WaitIdle() = 0;

  // Deletes `tenant`'s budget for good: runs `forget` (which removes it from the core) and then
  // removes what is durable of it, with no durable write of the budget in between, so that a next
  // owner does not bring it back. Blocks until done. `forget`'s error (nothing removed then), or
  // the error of the durable removal (the budget is gone here but may come back elsewhere).
  virtual absl::Status DeleteDurably(absl::string_view tenant,
                                     const std::function<absl::Status()>& forget) = 0;

  // The admin policy of `tenant` kept for the whole cluster (it wins over the policy file),
  // nullopt for none.
  virtual std::optional<v1::BudgetPolicy> AdminPolicy(absl::string_view tenant) const = 0;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_TENANT_ROUTER_H_
