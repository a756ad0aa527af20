// A gRPC proxy for RetryBudgetService.Sync that injects the network faults the accounting of
// DESIGN.md must survive, between the fleet's workers and the real server:
//  * drop response: forward the request, let the server apply it, answer the client UNAVAILABLE
//    (the response was lost; the client retries with the same seq);
//  * duplicate request: send the request to the server twice, answer with the second response;
//  * replay old: after forwarding a request, re-send an older request of the same instance (a
//    delayed packet arriving after newer ones; the server must call it stale). Final requests
//    are never replayed and end the instance's history;
//  * response delay (a slow server): every response is held for a fixed time after the server
//    answered (past the client's Sync deadline the client sees DEADLINE_EXCEEDED although the
//    server applied the request: a lost response, late).
// Each fault is decided independently per request with its probability, from one seeded PRNG.
//
//   auto proxy = FaultProxy::Start({.upstream = "127.0.0.1:50051", .drop_response = 0.1});
//   ClientOptions client{.target = (*proxy)->address()};
//   ...
//   FaultCounters faults = (*proxy)->counters();
#ifndef RETRYBUDGET_TOOLS_FLEET_FAULT_PROXY_H_
#define RETRYBUDGET_TOOLS_FLEET_FAULT_PROXY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "tools/fleet/fleet_report.h"

namespace retrybudget::fleet {

struct FaultProxyOptions {
  std::string listen = "127.0.0.1:0";
  std::string upstream = {};       // the real server, host:port
  double drop_response = 0;        // probabilities, each in [0, 1]
  double duplicate_request = 0;
  double replay_old = 0;
  absl::Duration response_delay = absl::ZeroDuration();  // >= 0; applied to every response
  uint64_t seed = 1;
  // Deadline of each forwarded call when the client's own deadline is later (or absent).
  absl::Duration upstream_timeout = absl::Seconds(2);
  // Requests remembered per instance as replay candidates.
  size_t history_per_instance = 8;
};

// Thread-safe.
class FaultProxy {
 public:
  // Binds `options.listen` and starts serving. INVALID_ARGUMENT for a probability outside
  // [0, 1] or an empty upstream (naming the option and value), UNAVAILABLE when the address
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<FaultProxy>> Start(FaultProxyOptions options);

  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;
  ~FaultProxy();  // Shutdown()

  // "127.0.0.1:<bound port>".
  const std::string& address() const;

  // What was injected so far.
  FaultCounters counters() const;

  // Stops serving; in-flight calls are cancelled after a short grace. Idempotent.
  void Shutdown();

 private:
  class Impl;
  explicit FaultProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_FAULT_PROXY_H_
