#include "server/service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpcpp/alarm.h"
#include "retrybudget/names.h"
#include "retrybudget/owner_redirect.h"
#include "server/replay_cache.h"
#include "server/request_parsing.h"
#include "server/reused_messages.h"

namespace retrybudget {
namespace {

class AllowAllAuthorizer final : public RequestAuthorizer {
 public:
  absl::Status Authorize(const grpc::ServerContextBase&, Rpc,
                         absl::Span<const absl::string_view>) override {
    return absl::OkStatus();
  }
};

class NoOpMetrics final : public ServiceMetrics {
 public:
  void RpcFinished(Rpc, absl::StatusCode, absl::Duration) override {}
};

ServiceOptions WithDefaults(ServiceOptions options) {
  if (options.authorizer == nullptr) options.authorizer = RequestAuthorizer::AllowAll();
  if (options.metrics == nullptr) options.metrics = ServiceMetrics::NoOp();
  if (options.clock == nullptr) options.clock = Clock::Real();
  return options;
}

// A unary reactor that tells InFlightRpcs when its RPC is done (after the status was sent or
// the call was cancelled). Deletes itself.
class TrackedReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit TrackedReactor(InFlightRpcs* in_flight) : in_flight_(in_flight) {}

  void OnDone() override {
    if (in_flight_ != nullptr) in_flight_->End();
    delete this;
  }

  // OnDone is trivial (an atomic decrement, a notify only while draining, a delete) and never
  // blocks, so gRPC may run it inline on the thread that completed the call. Otherwise every
  // RPC pays a hop to gRPC's executor thread (a futex wake and a context switch) just to run
  // it: ~15% of the server's CPU at one call in flight (docs/BENCHMARKS.md, section 2c). The
  // hook is gRPC's own (its DefaultReactor overrides it the same way) and not public API: a
  // gRPC that stopped reading it would only bring the hop back.
  bool InternalInlineable() override { return true; }

 private:
  InFlightRpcs* const in_flight_;  // null when not tracked
};

// One RPC's bookkeeping: started at construction, Finish() records the outcome and finishes the
// reactor. Every handler has the same shape: Admit, call the core, Finish.
class Call {
 public:
  Call(const ServiceOptions& options, grpc::CallbackServerContext* context, Rpc rpc)
      : options_(options),
        context_(context),
        rpc_(rpc),
        start_(options.clock->Now()),
        admitted_(options.in_flight == nullptr || options.in_flight->Begin()),
        reactor_(options.in_flight == nullptr
                     ? context->DefaultReactor()
                     : new TrackedReactor(admitted_ ? options.in_flight : nullptr)) {}

  // Whether the RPC may proceed: the server is not draining and the authorizer allows the
  // caller to act on `tenants`. Sets `*principal` (if not null) to the caller's identity.
  absl::Status Admit(absl::Span<const absl::string_view> tenants,
                     std::string* principal = nullptr) {
    if (!admitted_) return absl::UnavailableError("the budget server is shutting down");
    if (principal == nullptr) return options_.authorizer->Authorize(*context_, rpc_, tenants);
    return options_.authorizer->Authorize(*context_, rpc_, tenants, principal);
  }

  grpc::ServerUnaryReactor* Finish(const absl::Status& status) {
    options_.metrics->RpcFinished(rpc_, status.code(), options_.clock->Now() - start_);
    AddOwnerTrailer(status);
    reactor_->Finish(ToGrpcStatus(status));
    return reactor_;
  }

  // Finishes after `delay` without blocking this thread (tests only, see ServiceOptions).
  grpc::ServerUnaryReactor* FinishAfter(absl::Duration delay, const absl::Status& status) {
    options_.metrics->RpcFinished(rpc_, status.code(), options_.clock->Now() - start_);
    AddOwnerTrailer(status);
    // The alarm owns itself until it fires; it fires (ok = false) at once on shutdown.
    auto* alarm = new grpc::Alarm();
    alarm->Set(absl::ToChronoTime(absl::Now() + delay),
               [alarm, reactor = reactor_, grpc_status = ToGrpcStatus(status)](bool) {
                 reactor->Finish(grpc_status);
                 // Deleting an alarm inside its own callback is allowed once it has fired.
                 delete alarm;
               });
    return reactor_;
  }

 private:
  // A refusal that names the tenant's owner (cluster mode) carries it as trailing metadata
  // `retry-budget-owner: HOST:PORT` (owner_redirect.h).
  void AddOwnerTrailer(const absl::Status& status) {
    if (std::optional<std::string> owner = OwnerAddressOf(status); owner.has_value()) {
      context_->AddTrailingMetadata(std::string(kOwnerMetadataKey), *owner);
    }
  }

  const ServiceOptions& options_;
  grpc::CallbackServerContext* const context_;
  const Rpc rpc_;
  const absl::Time start_;
  const bool admitted_;
  grpc::ServerUnaryReactor* const reactor_;
};

}  // namespace

// The count and the draining flag are atomics, not a lock: every RPC passes here twice. The
// mutex only orders End() against a waiter (an End() that brings the count to zero while
// draining takes it before notifying, so the wake-up cannot fall between a waiter's check and
// its sleep). All accesses are sequentially consistent: Begin() and StartDraining() each write
// one atomic and read the other, so at least one of them sees the other's write.
bool InFlightRpcs::Begin() {
  in_flight_.fetch_add(1);
  if (draining_.load()) {
    End();
    return false;
  }
  return true;
}

void InFlightRpcs::End() {
  if (in_flight_.fetch_sub(1) == 1 && draining_.load()) {
    MutexLock lock(&mu_);
    idle_.notify_all();
  }
}

void InFlightRpcs::StartDraining() { draining_.store(true); }

bool InFlightRpcs::WaitIdle(absl::Time deadline) {
  std::unique_lock<Mutex> lock(mu_);
  return idle_.wait_until(lock, absl::ToChronoTime(deadline),
                          [this] { return in_flight_.load() == 0; });
}

absl::string_view RpcName(Rpc rpc) {
  switch (rpc) {
    case Rpc::kSync:
      return "Sync";
    case Rpc::kGetBudget:
      return "GetBudget";
    case Rpc::kListBudgets:
      return "ListBudgets";
    case Rpc::kPutPolicy:
      return "PutPolicy";
    case Rpc::kDeleteBudget:
      return "DeleteBudget";
    case Rpc::kListShards:
      return "ListShards";
  }
  return "unknown";
}

RequestAuthorizer* RequestAuthorizer::AllowAll() {
  static AllowAllAuthorizer* const authorizer = new AllowAllAuthorizer();
  return authorizer;
}

ServiceMetrics* ServiceMetrics::NoOp() {
  static NoOpMetrics* const metrics = new NoOpMetrics();
  return metrics;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the google.rpc.Code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// ---- RetryBudgetService ----

RetryBudgetServiceImpl::RetryBudgetServiceImpl(ServiceOptions options)
    : options_(WithDefaults(std::move(options))) {}

RetryBudgetServiceImpl::~RetryBudgetServiceImpl() = default;

grpc::ServerUnaryReactor* RetryBudgetServiceImpl::Sync(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response_bytes) {
  Call call(options_, context, Rpc::kSync);
  // Parsed into and answered from this thread's messages of the last Sync (reused_messages.h),
  // with the response's safe_share submessages kept (ClearForReuse): no allocation per string
  // or entry once the thread has seen a request of this shape.
  ReusedMessages<v1::SyncRequest, v1::SyncResponse, &ClearForReuse> messages(
      request_bytes->Length());
  v1::SyncRequest* request = messages.request();
  if (absl::Status s = ParseRequest(*request_bytes, request); !s.ok()) return call.Finish(s);
  absl::InlinedVector<absl::string_view, 16> tenants;
  tenants.reserve(request->tenants_size());
  for (const auto& t : request->tenants()) tenants.push_back(t.tenant());
  std::string principal;
  if (absl::Status s = call.Admit(tenants, &principal); !s.ok()) return call.Finish(s);

  // The core never blocks on I/O, so it runs inline on the callback thread.
  absl::Status result = options_.core->Sync(*request, messages.response(), principal);
  if (result.ok()) result = SerializeResponse(*messages.response(), response_bytes);
  if (options_.testonly_sync_response_delay > absl::ZeroDuration()) {
    return call.FinishAfter(options_.testonly_sync_response_delay, result);
  }
  return call.Finish(result);
}

// ---- BudgetAdminService ----

BudgetAdminServiceImpl::BudgetAdminServiceImpl(ServiceOptions options)
    : options_(WithDefaults(std::move(options))) {}

template <typename Request, typename Response, typename TenantsOf, typename Body>
grpc::ServerUnaryReactor* BudgetAdminServiceImpl::Handle(grpc::CallbackServerContext* context,
                                                         Rpc rpc,
                                                         const grpc::ByteBuffer* request_bytes,
                                                         grpc::ByteBuffer* response_bytes,
                                                         TenantsOf tenants_of, Body body) {
  Call call(options_, context, rpc);
  Request request;
  if (absl::Status s = ParseRequest(*request_bytes, &request); !s.ok()) return call.Finish(s);
  const absl::InlinedVector<absl::string_view, 1> tenants = tenants_of(request);
  if (absl::Status s = call.Admit(tenants); !s.ok()) return call.Finish(s);
  Response response;
  absl::Status result = body(request, &response);
  if (result.ok()) result = SerializeResponse(response, response_bytes);
  return call.Finish(result);
}

namespace {

template <typename Request>
absl::InlinedVector<absl::string_view, 1> TheTenant(const Request& request) {
  return {request.tenant()};
}

template <typename Request>
absl::InlinedVector<absl::string_view, 1> NoTenant(const Request&) {
  return {};
}

}  // namespace

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::GetBudget(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return Handle<v1::GetBudgetRequest, v1::GetBudgetResponse>(
      context, Rpc::kGetBudget, request, response, TheTenant<v1::GetBudgetRequest>,
      [this](const v1::GetBudgetRequest& r, v1::GetBudgetResponse* out) {
        absl::StatusOr<v1::BudgetStatus> result = options_.core->GetBudget(r.tenant());
        if (result.ok()) *out->mutable_budget() = *std::move(result);
        return result.status();
      });
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::ListBudgets(grpc::CallbackServerContext* context,
                                                              const grpc::ByteBuffer* request,
                                                              grpc::ByteBuffer* response) {
  return Handle<v1::ListBudgetsRequest, v1::ListBudgetsResponse>(
      context, Rpc::kListBudgets, request, response, NoTenant<v1::ListBudgetsRequest>,
      [this](const v1::ListBudgetsRequest& r, v1::ListBudgetsResponse* out) {
        absl::StatusOr<v1::ListBudgetsResponse> result = options_.core->ListBudgets(r);
        if (result.ok()) *out = *std::move(result);
        return result.status();
      });
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::ListShards(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer* request,
                                                             grpc::ByteBuffer* response) {
  return Handle<v1::ListShardsRequest, v1::ListShardsResponse>(
      context, Rpc::kListShards, request, response, NoTenant<v1::ListShardsRequest>,
      [this](const v1::ListShardsRequest&, v1::ListShardsResponse* out) {
        if (options_.list_shards) *out = options_.list_shards();
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::PutPolicy(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return Handle<v1::PutPolicyRequest, v1::PutPolicyResponse>(
      context, Rpc::kPutPolicy, request, response, TheTenant<v1::PutPolicyRequest>,
      [this](const v1::PutPolicyRequest& r, v1::PutPolicyResponse* out) {
        absl::StatusOr<v1::BudgetStatus> result =
            options_.put_policy
                ? options_.put_policy(r)
                : options_.core->PutPolicy(r.tenant(), r.policy(), r.update_mask());
        if (result.ok() && options_.log) {
          const v1::BudgetPolicy& p = result->policy();
          const std::string mask =
              r.update_mask().paths().empty()
                  ? ""
                  : absl::StrCat(" (update_mask: ", absl::StrJoin(r.update_mask().paths(), ", "),
                                 ")");
          options_.log(absl::StrFormat(
              "admin: tenant %s policy set%s: capacity %g, refill %g/s, credit %g, lease %d ms, "
              "mode %s; level %g",
              QuoteForError(r.tenant()), mask, p.capacity(), p.refill_per_second(),
              p.success_credit(), p.lease_ttl_ms(),
              p.mode() == v1::MODE_SHADOW ? "shadow" : "enforce", result->tokens()));
        }
        if (result.ok()) *out->mutable_budget() = *std::move(result);
        return result.status();
      });
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::DeleteBudget(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Handle<v1::DeleteBudgetRequest, v1::DeleteBudgetResponse>(
      context, Rpc::kDeleteBudget, request, response, TheTenant<v1::DeleteBudgetRequest>,
      [this](const v1::DeleteBudgetRequest& r, v1::DeleteBudgetResponse*) {
        absl::Status deleted = options_.core->DeleteBudget(r.tenant());
        if (deleted.ok() && options_.log) {
          options_.log(absl::StrCat("admin: tenant ", QuoteForError(r.tenant()),
                                    " budget deleted"));
        }
        return deleted;
      });
}

}  // namespace retrybudget
