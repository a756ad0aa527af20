#include "flaky_backend.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>

#include "absl/strings/str_cat.h"

namespace retrybudget::examples {
namespace {

std::optional<std::string> ClientHeader(const grpc::ServerContext& ctx, const char* key) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return std::nullopt;
  return std::string(it->second.data(), it->second.size());
}

}  // namespace

FlakyEchoService::FlakyEchoService(FlakyOptions options)
    : options_(options), gen_(std::seed_seq{options.seed}) {}

void FlakyEchoService::set_options(FlakyOptions options) {
  absl::MutexLock lock(&mu_);
  options_ = std::move(options);
}

std::vector<ReceivedCall> FlakyEchoService::calls() const {
  absl::MutexLock lock(&mu_);
  return calls_;
}

int FlakyEchoService::call_count() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(calls_.size());
}

grpc::Status FlakyEchoService::Echo(grpc::ServerContext* context, const EchoRequest* request,
                                    EchoReply* reply) {
  ReceivedCall call;
  call.idempotency_key = ClientHeader(*context, "x-idempotency-key").value_or("");
  call.previous_attempts = ClientHeader(*context, "grpc-previous-rpc-attempts");
  call.received = absl::Now();

  FlakyOptions options;
  size_t index;
  bool fail;
  {
    absl::MutexLock lock(&mu_);
    options = options_;
    index = calls_.size();
    fail = static_cast<int>(index) < options.fail_first ||
           absl::Bernoulli(gen_, options.failure_probability);
    call.failed = fail;
    calls_.push_back(call);
    ++keys_[call.idempotency_key].first;
  }

  // A slow backend: hold the call, but give up as soon as the client does.
  const absl::Time until =
      absl::Now() + (static_cast<int>(index) < options.hold_calls ? options.hold
                                                                  : absl::ZeroDuration());
  while (absl::Now() < until) {
    if (context->IsCancelled()) {
      absl::MutexLock lock(&mu_);
      calls_[index].cancelled = true;
      return grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled the call");
    }
    absl::SleepFor(absl::Milliseconds(1));
  }

  if (fail) {
    if (options.pushback_ms.has_value()) {
      context->AddTrailingMetadata("grpc-retry-pushback-ms", *options.pushback_ms);
    }
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("flaky backend: call ", index, " failed on purpose"));
  }

  absl::MutexLock lock(&mu_);
  auto& [attempts, succeeded] = keys_[call.idempotency_key];
  reply->set_message(request->message());
  reply->set_attempts_seen(attempts);
  reply->set_duplicate(!call.idempotency_key.empty() && succeeded);
  succeeded = true;
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<FlakyBackend>> FlakyBackend::Start(const std::string& address,
                                                                  FlakyOptions options) {
  std::unique_ptr<FlakyBackend> backend(new FlakyBackend());
  backend->service_ = std::make_unique<FlakyEchoService>(std::move(options));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &backend->port_);
  builder.RegisterService(backend->service_.get());
  backend->server_ = builder.BuildAndStart();
  if (backend->server_ == nullptr || backend->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("flaky backend: cannot listen on ", address));
  }
  return backend;
}

FlakyBackend::~FlakyBackend() { Shutdown(); }

std::string FlakyBackend::target() const { return absl::StrCat("127.0.0.1:", port_); }

void FlakyBackend::Shutdown() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
    server_.reset();
  }
}

}  // namespace retrybudget::examples
