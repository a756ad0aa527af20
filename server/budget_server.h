// A running gRPC server with both budget services on one address: what the binary runs and what
// the integration tests start in-process on port 0.
//
//   auto server = BudgetServer::Start({.listen = "127.0.0.1:0", .service = {.core = core}});
//   if (!server.ok()) return server.status();
//   int port = (*server)->port();
//   ...
//   (*server)->Shutdown(absl::Seconds(5));
#ifndef RETRYBUDGET_SERVER_BUDGET_SERVER_H_
#define RETRYBUDGET_SERVER_BUDGET_SERVER_H_

#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/mutex.h"
#include "server/service.h"

namespace retrybudget {

inline constexpr int kDefaultMaxMessageBytes = 1 << 20;

struct ServerOptions {
  // host:port to listen on ("127.0.0.1:50051", "[::1]:0", "0.0.0.0:8080"); port 0 picks a free
  // port (see BudgetServer::port()).
  std::string listen = "127.0.0.1:50051";
  // Largest request accepted; a larger one is refused with RESOURCE_EXHAUSTED before it is
  // parsed. Bytes, > 0.
  int max_message_bytes = kDefaultMaxMessageBytes;
  // The services' options (the core, hooks). `service.core` is required.
  ServiceOptions service;
  // Transport credentials; null means insecure (plaintext). TLS plugs in here.
  std::shared_ptr<grpc::ServerCredentials> credentials = nullptr;
};

// Thread-safe.
class BudgetServer {
 public:
  // Binds `options.listen` and starts serving. INVALID_ARGUMENT for bad options (naming the
  // option and value), UNAVAILABLE when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<BudgetServer>> Start(ServerOptions options);

  BudgetServer(const BudgetServer&) = delete;
  BudgetServer& operator=(const BudgetServer&) = delete;
  // Shuts down with no grace period if Shutdown() was not called.
  ~BudgetServer();

  // The port actually bound (the chosen one when listening on port 0).
  int port() const { return port_; }
  // `listen` with the bound port, e.g. "127.0.0.1:41873".
  const std::string& address() const { return address_; }
  // False when the server runs without TLS.
  bool secure() const { return secure_; }

  // Sets the grpc.health.v1 status (cluster mode: NOT_SERVING until the server has joined, and
  // while it cannot be sure of its etcd lease). No effect after Shutdown().
  void SetServing(bool serving);

  // Refuses new RPCs (UNAVAILABLE), lets in-flight ones finish until now + `grace`, then
  // cancels the rest, closes every connection and returns once every handler has finished.
  // Returns as soon as nothing is in flight: idle client connections do not hold it up.
  // Blocks. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  explicit BudgetServer(ServerOptions options);
  absl::Status Init();

  const ServerOptions options_;
  const bool secure_;
  int port_ = 0;
  std::string address_;
  InFlightRpcs in_flight_;
  RetryBudgetServiceImpl budget_service_;
  BudgetAdminServiceImpl admin_service_;
  std::unique_ptr<grpc::Server> server_;

  Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_BUDGET_SERVER_H_
