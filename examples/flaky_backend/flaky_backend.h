// A deliberately unreliable gRPC echo backend, for the flaky-worker example and the retry
// helper's end-to-end tests. It fails with UNAVAILABLE at a configurable rate, can ask for
// pushback, can hold calls (until they time out or are cancelled), and records the metadata of
// every call it receives.
//
//   auto backend = FlakyBackend::Start("127.0.0.1:0", {.failure_probability = 0.3});
//   if (!backend.ok()) return backend.status();
//   auto stub = FlakyEcho::NewStub(grpc::CreateChannel((*backend)->target(), ...));
//   ...
//   for (const ReceivedCall& c : (*backend)->service().calls()) { ... }
#ifndef RETRYBUDGET_EXAMPLES_FLAKY_BACKEND_H_
#define RETRYBUDGET_EXAMPLES_FLAKY_BACKEND_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/server.h>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "flaky.grpc.pb.h"

namespace retrybudget::examples {

struct FlakyOptions {
  // Chance in [0, 1] that a call fails with UNAVAILABLE.
  double failure_probability = 0.3;
  // The first `fail_first` calls fail whatever the probability (deterministic tests).
  int fail_first = 0;
  // When set, failures carry this `grpc-retry-pushback-ms` trailer value verbatim (it may be
  // negative or garbage on purpose).
  std::optional<std::string> pushback_ms = std::nullopt;
  // Each call waits this long before answering, or until the client cancels it (then it ends
  // with CANCELLED), whichever comes first.
  absl::Duration hold = absl::ZeroDuration();
  // Only the first `hold_calls` calls are held (the default: all of them).
  int hold_calls = std::numeric_limits<int>::max();
  // Seed of the failure draws.
  uint64_t seed = 1;
};

// What the backend saw of one call.
struct ReceivedCall {
  std::string idempotency_key = {};              // `x-idempotency-key`, empty if absent
  std::optional<std::string> previous_attempts = std::nullopt;  // `grpc-previous-rpc-attempts`, if sent
  bool failed = false;                           // answered UNAVAILABLE
  bool cancelled = false;                        // the client cancelled it while held
  absl::Time received = {};                      // real time of arrival
};

// Thread-safe (the server calls Echo on many threads).
class FlakyEchoService final : public FlakyEcho::Service {
 public:
  explicit FlakyEchoService(FlakyOptions options);

  grpc::Status Echo(grpc::ServerContext* context, const EchoRequest* request,
                    EchoReply* reply) override;

  // Replaces the behaviour for the calls that arrive from now on.
  void set_options(FlakyOptions options);
  // Every call received so far, in arrival order.
  std::vector<ReceivedCall> calls() const;
  int call_count() const;

 private:
  mutable absl::Mutex mu_;
  FlakyOptions options_ ABSL_GUARDED_BY(mu_);
  absl::BitGen gen_ ABSL_GUARDED_BY(mu_);
  std::vector<ReceivedCall> calls_ ABSL_GUARDED_BY(mu_);
  // Per idempotency key: attempts seen and whether one succeeded.
  std::map<std::string, std::pair<uint32_t, bool>> keys_ ABSL_GUARDED_BY(mu_);
};

// The service in a running gRPC server (insecure, for examples and tests). Thread-safe.
class FlakyBackend {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a free port). UNAVAILABLE if it cannot bind.
  static absl::StatusOr<std::unique_ptr<FlakyBackend>> Start(const std::string& address,
                                                             FlakyOptions options);
  ~FlakyBackend();

  int port() const { return port_; }
  std::string target() const;  // "127.0.0.1:<port>"
  FlakyEchoService& service() { return *service_; }
  // Stops accepting calls and cancels those in flight. Idempotent; not to be called from two
  // threads at once.
  void Shutdown();

 private:
  FlakyBackend() = default;
  std::unique_ptr<FlakyEchoService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace retrybudget::examples

#endif  // RETRYBUDGET_EXAMPLES_FLAKY_BACKEND_H_
