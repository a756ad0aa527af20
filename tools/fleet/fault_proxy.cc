#include "tools/fleet/fault_proxy.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"

namespace retrybudget::fleet {

// The Sync service of the proxy. Thread-safe: gRPC runs handlers on a pool.
class FaultProxy::Impl final : public v1::RetryBudgetService::Service {
 public:
  explicit Impl(FaultProxyOptions options)
      : options_(std::move(options)),
        stub_(v1::RetryBudgetService::NewStub(
            grpc::CreateChannel(options_.upstream, grpc::InsecureChannelCredentials()))),
        rng_(options_.seed) {}

  absl::Status Start() {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(options_.listen, grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
    if (server_ == nullptr || port == 0) {
      return absl::UnavailableError(
          absl::StrCat("fault proxy: cannot listen on '", options_.listen, "'"));
    }
    address_ = absl::StrCat(options_.listen.substr(0, options_.listen.rfind(':')), ":", port);
    return absl::OkStatus();
  }

  void Shutdown() {
    absl::MutexLock lock(&shutdown_mu_);
    if (server_ != nullptr && !shut_down_) {
      server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      shut_down_ = true;
    }
  }

  grpc::Status Sync(grpc::ServerContext* context, const v1::SyncRequest* request,
                    v1::SyncResponse* response) override {
    bool drop = false, duplicate = false, replay = false;
    {
      absl::MutexLock lock(&mu_);
      ++counters_.proxied_requests;
      drop = Roll(options_.drop_response);
      duplicate = Roll(options_.duplicate_request);
      replay = Roll(options_.replay_old) && !request->final();
    }

    grpc::Status status = Forward(*context, *request, response);
    if (!status.ok()) {
      absl::MutexLock lock(&mu_);
      ++counters_.upstream_errors;
      return status;
    }
    if (duplicate) {
      v1::SyncResponse second;
      grpc::Status again = Forward(*context, *request, &second);
      absl::MutexLock lock(&mu_);
      ++counters_.duplicated_requests;
      if (again.ok()) {
        *response = std::move(second);
      } else {
        ++counters_.upstream_errors;
      }
    }
    if (replay) ReplayOlder(*context, *request);
    Remember(*request);
    if (options_.response_delay > absl::ZeroDuration()) {
      // A slow server: the answer exists, the client gets it late (or never, past its deadline).
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(options_.response_delay));
      absl::MutexLock lock(&mu_);
      ++counters_.delayed_responses;
    }
    if (drop) {
      absl::MutexLock lock(&mu_);
      ++counters_.dropped_responses;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "fault injected: response dropped after the server applied it");
    }
    return grpc::Status::OK;
  }

  const std::string& address() const { return address_; }

  FaultCounters counters() {
    absl::MutexLock lock(&mu_);
    return counters_;
  }

 private:
  bool Roll(double p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p;
  }

  grpc::Status Forward(const grpc::ServerContext& incoming, const v1::SyncRequest& request,
                       v1::SyncResponse* response) {
    grpc::ClientContext context;
    const auto ours = std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(options_.upstream_timeout);
    context.set_deadline(std::min(incoming.deadline(), ours));
    return stub_->Sync(&context, request, response);
  }

  // Re-sends a request of the same instance with a lower seq than `newest`.
  void ReplayOlder(const grpc::ServerContext& incoming, const v1::SyncRequest& newest) {
    v1::SyncRequest old;
    {
      absl::MutexLock lock(&mu_);
      auto it = history_.find(newest.instance_id());
      if (it == history_.end()) return;
      std::vector<const v1::SyncRequest*> older;
      for (const v1::SyncRequest& r : it->second) {
        if (r.seq() < newest.seq()) older.push_back(&r);
      }
      if (older.empty()) return;
      old = *older[std::uniform_int_distribution<size_t>(0, older.size() - 1)(rng_)];
    }
    v1::SyncResponse response;
    grpc::Status status = Forward(incoming, old, &response);
    absl::MutexLock lock(&mu_);
    ++counters_.replayed_requests;
    if (!status.ok()) {
      ++counters_.upstream_errors;
      return;
    }
    if (response.stale()) ++counters_.replays_stale;
    for (const v1::TenantGrant& grant : response.tenants()) {
      counters_.replay_granted_tokens += grant.granted();
    }
  }

  void Remember(const v1::SyncRequest& request) {
    absl::MutexLock lock(&mu_);
    if (request.final()) {
      history_.erase(request.instance_id());
      return;
    }
    std::deque<v1::SyncRequest>& h = history_[request.instance_id()];
    h.push_back(request);
    while (h.size() > options_.history_per_instance) h.pop_front();
  }

  const FaultProxyOptions options_;
  const std::unique_ptr<v1::RetryBudgetService::Stub> stub_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;

  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
  FaultCounters counters_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::deque<v1::SyncRequest>> history_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<FaultProxy>> FaultProxy::Start(FaultProxyOptions options) {
  for (auto [name, p] : {std::pair<const char*, double>{"--fault-drop-response",
                                                        options.drop_response},
                         {"--fault-duplicate-request", options.duplicate_request},
                         {"--fault-replay-old", options.replay_old}}) {
    if (!(p >= 0 && p <= 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": probability must be in [0, 1], got ", p));
    }
  }
  if (options.upstream.empty()) {
    return absl::InvalidArgumentError("fault proxy: upstream is empty");
  }
  if (options.response_delay < absl::ZeroDuration() ||
      options.response_delay > absl::Seconds(60)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fault-delay: must be in [0, 60s], got ", absl::FormatDuration(options.response_delay)));
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status st = impl->Start(); !st.ok()) return st;
  return std::unique_ptr<FaultProxy>(new FaultProxy(std::move(impl)));
}

FaultProxy::FaultProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FaultProxy::~FaultProxy() { Shutdown(); }
const std::string& FaultProxy::address() const { return impl_->address(); }
FaultCounters FaultProxy::counters() const { return impl_->counters(); }
void FaultProxy::Shutdown() { impl_->Shutdown(); }

}  // namespace retrybudget::fleet
