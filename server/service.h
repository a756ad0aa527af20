// The gRPC layer of the budget server: RetryBudgetService and BudgetAdminService on the callback
// API. Each handler checks the caller (RequestAuthorizer), translates the request into one
// BudgetCore call, converts the absl::Status into a grpc::Status with the same code and message,
// records the outcome (ServiceMetrics) and finishes. No budget logic lives here.
//
//   RetryBudgetServiceImpl budget({.core = core.get()});
//   BudgetAdminServiceImpl admin({.core = core.get()});
//   builder.RegisterService(&budget);
//   builder.RegisterService(&admin);
//
// Handlers run inline on gRPC's callback threads: the core never blocks on I/O.
//
// Later issues plug in without touching the handlers: per-tenant credentials as a
// RequestAuthorizer, Prometheus as a ServiceMetrics.
#ifndef RETRYBUDGET_SERVER_SERVICE_H_
#define RETRYBUDGET_SERVER_SERVICE_H_

#include <atomic>
#include <functional>
#include <memory>

#include "absl/strings/string_view.h"

#include <condition_variable>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/clock.h"
#include "retrybudget/mutex.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "server/budget_core.h"

namespace retrybudget {

// The RPCs of the server, for hooks and metrics labels.
enum class Rpc { kSync, kGetBudget, kListBudgets, kPutPolicy, kDeleteBudget, kListShards };

// "Sync", "GetBudget", ...: the method name as in budget.proto.
absl::string_view RpcName(Rpc rpc);

// Decides whether the caller of an RPC may act on the tenants it names (a later issue checks
// bearer tokens in the metadata, per tenant, and a separate admin credential).
// Implementations must be thread-safe and must not block: they run on gRPC's callback threads.
class RequestAuthorizer {
 public:
  virtual ~RequestAuthorizer() = default;

  // Called before the core sees the request. `tenants` are the tenant names the request names:
  // every entry of a Sync, the one tenant of GetBudget/PutPolicy/DeleteBudget, none for
  // ListBudgets. A non-OK status (UNAUTHENTICATED, PERMISSION_DENIED) is returned to the caller
  // as is, and nothing is applied.
  virtual absl::Status Authorize(const grpc::ServerContextBase& context, Rpc rpc,
                                 absl::Span<const absl::string_view> tenants) = 0;
  // The same, also naming the caller in `*principal` when allowed: the identity that owns the
  // instance ids it uses (BudgetCore::Sync). "" for an authorizer without identities (every
  // caller is the same anonymous principal), which is what this default gives.
  virtual absl::Status Authorize(const grpc::ServerContextBase& context, Rpc rpc,
                                 absl::Span<const absl::string_view> tenants,
                                 std::string* principal) {
    principal->clear();
    return Authorize(context, rpc, tenants);
  }

  // Allows everything (the default until credentials exist). Never null, never destroyed.
  static RequestAuthorizer* AllowAll();
};

// Receives one call per finished RPC. Implementations must be thread-safe and cheap (they run on
// the RPC's thread, once per RPC).
class ServiceMetrics {
 public:
  virtual ~ServiceMetrics() = default;

  // `code` is the status returned to the caller; `elapsed` the time the handler took.
  virtual void RpcFinished(Rpc rpc, absl::StatusCode code, absl::Duration elapsed) = 0;

  // Records nothing. Never null, never destroyed.
  static ServiceMetrics* NoOp();
};

// Counts RPCs from the start of their handler until they are done (response sent or call
// cancelled), and refuses new ones once draining, so a shutdown can wait for exactly the RPCs in
// flight. Thread-safe.
class InFlightRpcs {
 public:
  // Registers a starting RPC. False when draining: the RPC must be refused and End() not called.
  bool Begin();
  // The RPC admitted by Begin() is done.
  void End();
  // From now on Begin() returns false.
  void StartDraining();
  // Blocks until no admitted RPC is in flight or `deadline` passes (real time). True when idle.
  bool WaitIdle(absl::Time deadline);

 private:
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  Mutex mu_;                          // see End()
  std::condition_variable_any idle_;  // notified when in_flight_ drops to 0 while draining
};

struct ServiceOptions {
  // The budgets. Required; not owned; must outlive the services.
  BudgetCore* core = nullptr;
  // Receives one line per policy change made through BudgetAdminService (never one per Sync).
  // Must be thread-safe. Null: silent.
  std::function<void(absl::string_view)> log = nullptr;
  // AllowAll() if null. Not owned.
  RequestAuthorizer* authorizer = nullptr;
  // NoOp() if null. Not owned.
  ServiceMetrics* metrics = nullptr;
  // Measures handler latency for `metrics`; Clock::Real() if null. Not owned.
  Clock* clock = nullptr;
  // When set, every RPC is counted in it and RPCs arriving while it drains are refused with
  // UNAVAILABLE (BudgetServer uses it for a prompt clean shutdown). Not owned.
  InFlightRpcs* in_flight = nullptr;
  // Tests only: a Sync is applied at once but its response is sent this much later (with a gRPC
  // alarm, no thread blocked), which holds RPCs in flight for shutdown tests. Zero in
  // production.
  absl::Duration testonly_sync_response_delay = absl::ZeroDuration();
  // Cluster mode: the shards and their owners for ListShards. Null: not in cluster mode.
  std::function<v1::ListShardsResponse()> list_shards = nullptr;
  // Cluster mode: PutPolicy goes here (stores the policy in etcd for every server) instead of
  // to the core. Null: the core.
  std::function<absl::StatusOr<v1::BudgetStatus>(const v1::PutPolicyRequest&)> put_policy =
      nullptr;
};

// The absl::Status as a grpc::Status with the same code and message.
grpc::Status ToGrpcStatus(const absl::Status& status);

// Thread-safe (all state is in the BudgetCore). Sync is registered as a raw method: the service
// parses the request bytes itself (request_parsing.h), so bytes that are not a valid SyncRequest
// (invalid UTF-8 in a string field, a broken encoding) get INVALID_ARGUMENT naming what is wrong,
// not gRPC's bare UNIMPLEMENTED. The request and response are the serving thread's, reused from
// its previous Sync (reused_messages.h).
class RetryBudgetServiceImpl final
    : public v1::RetryBudgetService::WithRawCallbackMethod_Sync<v1::RetryBudgetService::Service> {
 public:
  explicit RetryBudgetServiceImpl(ServiceOptions options);
  ~RetryBudgetServiceImpl() override;

  grpc::ServerUnaryReactor* Sync(grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;

 private:
  const ServiceOptions options_;
};

// Every method is registered as a raw method, for the same reason as Sync: a request whose
// bytes do not parse (invalid UTF-8 in `tenant`, garbage) gets INVALID_ARGUMENT naming the field.
using RawBudgetAdminService = v1::BudgetAdminService::WithRawCallbackMethod_GetBudget<
    v1::BudgetAdminService::WithRawCallbackMethod_ListBudgets<
        v1::BudgetAdminService::WithRawCallbackMethod_PutPolicy<
            v1::BudgetAdminService::WithRawCallbackMethod_DeleteBudget<
                v1::BudgetAdminService::WithRawCallbackMethod_ListShards<
                    v1::BudgetAdminService::Service>>>>>;

// Thread-safe (all state is in the BudgetCore).
class BudgetAdminServiceImpl final : public RawBudgetAdminService {
 public:
  explicit BudgetAdminServiceImpl(ServiceOptions options);

  grpc::ServerUnaryReactor* GetBudget(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListBudgets(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PutPolicy(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteBudget(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListShards(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;

 private:
  // The shape of every admin method: parse `request_bytes` as a Request, Admit the caller for
  // the tenants `tenants_of` names, run `body`, serialise its Response into `response_bytes`.
  template <typename Request, typename Response, typename TenantsOf, typename Body>
  grpc::ServerUnaryReactor* Handle(grpc::CallbackServerContext* context, Rpc rpc,
                                   const grpc::ByteBuffer* request_bytes,
                                   grpc::ByteBuffer* response_bytes, TenantsOf tenants_of,
                                   Body body);

  const ServiceOptions options_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_SERVICE_H_
