#include "server/service.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/alarm.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "retrybudget/names.h"
#include "retrybudget/owner_redirect.h"
#include "server/arena_messages.h"

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

constexpr absl::string_view kNotASyncRequest = "request is not a valid retrybudget.v1.SyncRequest: ";

// Why `bytes`, which failed to parse as a SyncRequest, are not one: the first string field
// that is not valid (invalid UTF-8 is never a valid instance id or tenant name), else the
// encoding. Runs only on a failed parse.
absl::Status DiagnoseUnparseable(const std::string& bytes) {
  using google::protobuf::UnknownField;
  using google::protobuf::UnknownFieldSet;
  auto invalid = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(kNotASyncRequest, why));
  };
  UnknownFieldSet fields;
  if (!fields.ParseFromString(bytes)) return invalid("the bytes are not a protobuf encoding");
  // The wire type each field of SyncRequest and TenantSync has (budget.proto).
  auto expected = [](int number, bool entry) {
    const bool text = entry ? number == 1 : number == 1 || number == 3;
    return text ? UnknownField::TYPE_LENGTH_DELIMITED : UnknownField::TYPE_VARINT;
  };
  int tenant_index = 0;
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& f = fields.field(i);
    if (f.number() < 1 || f.number() > 4) continue;  // unknown fields are allowed
    if (f.type() != expected(f.number(), false)) {
      return invalid(absl::StrCat("field ", f.number(), " has the wrong wire type"));
    }
    if (f.number() == 1) {
      if (auto s = ValidateInstanceId(f.length_delimited()); !s.ok()) return invalid(s.message());
    } else if (f.number() == 3) {
      const std::string field = absl::StrCat("tenants[", tenant_index++, "]");
      UnknownFieldSet entry;
      if (!entry.ParseFromString(f.length_delimited())) {
        return invalid(absl::StrCat(field, " is not a protobuf encoding"));
      }
      for (int j = 0; j < entry.field_count(); ++j) {
        const UnknownField& e = entry.field(j);
        if (e.number() < 1 || e.number() > 8) continue;
        if (e.type() != expected(e.number(), true)) {
          return invalid(absl::StrCat(field, " field ", e.number(), " has the wrong wire type"));
        }
        if (e.number() == 1) {
          if (auto s = ValidateTenantName(e.length_delimited(), field + ".tenant"); !s.ok()) {
            return invalid(s.message());
          }
        }
      }
    }
  }
  return invalid("the encoding does not parse");
}

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

absl::Status ParseSyncRequest(const grpc::ByteBuffer& bytes, v1::SyncRequest* request) {
  grpc::ByteBuffer shared(bytes);  // shares the slices; the reader consumes this copy
  {
    grpc::ProtoBufferReader reader(&shared);
    if (request->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  }
  std::vector<grpc::Slice> slices;
  std::string flat;
  if (bytes.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  return DiagnoseUnparseable(flat);
}

RetryBudgetServiceImpl::RetryBudgetServiceImpl(ServiceOptions options)
    : options_(WithDefaults(std::move(options))) {}

RetryBudgetServiceImpl::~RetryBudgetServiceImpl() = default;

grpc::ServerUnaryReactor* RetryBudgetServiceImpl::Sync(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request_bytes,
                                                       grpc::ByteBuffer* response_bytes) {
  Call call(options_, context, Rpc::kSync);
  // Parsed and answered on an arena that lives until the response is serialised below.
  ArenaMessages<v1::SyncRequest, v1::SyncResponse> messages;
  v1::SyncRequest* request = messages.request();
  if (absl::Status s = ParseSyncRequest(*request_bytes, request); !s.ok()) return call.Finish(s);
  absl::InlinedVector<absl::string_view, 16> tenants;
  tenants.reserve(request->tenants_size());
  for (const auto& t : request->tenants()) tenants.push_back(t.tenant());
  std::string principal;
  if (absl::Status s = call.Admit(tenants, &principal); !s.ok()) return call.Finish(s);

  // The core never blocks on I/O, so it runs inline on the callback thread.
  absl::Status result = options_.core->Sync(*request, messages.response(), principal);
  if (result.ok()) {
    bool own_buffer = false;
    const grpc::Status serialized = grpc::SerializationTraits<v1::SyncResponse>::Serialize(
        *messages.response(), response_bytes, &own_buffer);
    if (!serialized.ok()) {
      result = absl::InternalError(
          absl::StrCat("could not serialise the response: ", serialized.error_message()));
    }
  }
  if (options_.testonly_sync_response_delay > absl::ZeroDuration()) {
    return call.FinishAfter(options_.testonly_sync_response_delay, result);
  }
  return call.Finish(result);
}

// ---- BudgetAdminService ----

BudgetAdminServiceImpl::BudgetAdminServiceImpl(ServiceOptions options)
    : options_(WithDefaults(std::move(options))) {}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::GetBudget(grpc::CallbackServerContext* context,
                                                            const v1::GetBudgetRequest* request,
                                                            v1::GetBudgetResponse* response) {
  Call call(options_, context, Rpc::kGetBudget);
  const absl::string_view tenant = request->tenant();
  if (absl::Status s = call.Admit({&tenant, 1}); !s.ok()) return call.Finish(s);
  absl::StatusOr<v1::BudgetStatus> result = options_.core->GetBudget(tenant);
  if (result.ok()) *response->mutable_budget() = *std::move(result);
  return call.Finish(result.status());
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::ListBudgets(
    grpc::CallbackServerContext* context, const v1::ListBudgetsRequest* request,
    v1::ListBudgetsResponse* response) {
  Call call(options_, context, Rpc::kListBudgets);
  if (absl::Status s = call.Admit({}); !s.ok()) return call.Finish(s);
  absl::StatusOr<v1::ListBudgetsResponse> result = options_.core->ListBudgets(*request);
  if (result.ok()) *response = *std::move(result);
  return call.Finish(result.status());
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::ListShards(
    grpc::CallbackServerContext* context, const v1::ListShardsRequest*,
    v1::ListShardsResponse* response) {
  Call call(options_, context, Rpc::kListShards);
  if (absl::Status s = call.Admit({}); !s.ok()) return call.Finish(s);
  if (options_.list_shards) *response = options_.list_shards();
  return call.Finish(absl::OkStatus());
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::PutPolicy(grpc::CallbackServerContext* context,
                                                            const v1::PutPolicyRequest* request,
                                                            v1::PutPolicyResponse* response) {
  Call call(options_, context, Rpc::kPutPolicy);
  const absl::string_view tenant = request->tenant();
  if (absl::Status s = call.Admit({&tenant, 1}); !s.ok()) return call.Finish(s);
  absl::StatusOr<v1::BudgetStatus> result =
      options_.put_policy ? options_.put_policy(tenant, request->policy())
                          : options_.core->PutPolicy(tenant, request->policy());
  if (result.ok() && options_.log) {
    const v1::BudgetPolicy& p = result->policy();
    options_.log(absl::StrFormat(
        "admin: tenant %s policy set: capacity %g, refill %g/s, credit %g, lease %d ms; level %g",
        QuoteForError(tenant), p.capacity(), p.refill_per_second(), p.success_credit(),
        p.lease_ttl_ms(), result->tokens()));
  }
  if (result.ok()) *response->mutable_budget() = *std::move(result);
  return call.Finish(result.status());
}

grpc::ServerUnaryReactor* BudgetAdminServiceImpl::DeleteBudget(
    grpc::CallbackServerContext* context, const v1::DeleteBudgetRequest* request,
    v1::DeleteBudgetResponse* /*response*/) {
  Call call(options_, context, Rpc::kDeleteBudget);
  const absl::string_view tenant = request->tenant();
  if (absl::Status s = call.Admit({&tenant, 1}); !s.ok()) return call.Finish(s);
  absl::Status deleted = options_.core->DeleteBudget(tenant);
  if (deleted.ok() && options_.log) {
    options_.log(absl::StrCat("admin: tenant ", QuoteForError(tenant), " budget deleted"));
  }
  return call.Finish(deleted);
}

}  // namespace retrybudget
