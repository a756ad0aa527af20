#include "server/budget_server.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "retrybudget/names.h"

namespace retrybudget {
namespace {

// Splits "host:port" / "[v6]:port" at the last colon. False when there is no numeric port.
bool SplitHostPort(absl::string_view listen, absl::string_view* host, int* port) {
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  int p = 0;
  if (!absl::SimpleAtoi(listen.substr(colon + 1), &p) || p < 0 || p > 65535) return false;
  *host = listen.substr(0, colon);
  *port = p;
  return true;
}

// Sets the standard grpc.health.v1 status of the whole server ("") and of both services.
void SetHealth(grpc::Server& server, bool serving) {
  grpc::HealthCheckServiceInterface* health = server.GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(v1::RetryBudgetService::service_full_name(), serving);
  health->SetServingStatus(v1::BudgetAdminService::service_full_name(), serving);
  health->SetServingStatus(serving);
}

ServiceOptions Tracked(ServiceOptions options, InFlightRpcs* in_flight) {
  options.in_flight = in_flight;
  return options;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BudgetServer>> BudgetServer::Start(ServerOptions options) {
  if (options.service.core == nullptr) {
    return absl::InvalidArgumentError("ServerOptions.service.core is null");
  }
  absl::string_view host;
  int port = 0;
  if (!SplitHostPort(options.listen, &host, &port)) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address ", QuoteForError(options.listen),
                     " is not host:port with a port in [0, 65535]"));
  }
  if (options.max_message_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("max_message_bytes = ",
                                                   options.max_message_bytes, " must be > 0"));
  }
  std::unique_ptr<BudgetServer> server(new BudgetServer(std::move(options)));
  if (absl::Status s = server->Init(); !s.ok()) return s;
  return server;
}

BudgetServer::BudgetServer(ServerOptions options)
    : options_(std::move(options)),
      secure_(options_.credentials != nullptr),
      budget_service_(Tracked(options_.service, &in_flight_)),
      admin_service_(Tracked(options_.service, &in_flight_)) {}

absl::Status BudgetServer::Init() {
  // Standard health checking (grpc.health.v1, NOT_SERVING from the start of Shutdown()) and
  // server reflection, so generic gRPC tools can talk to the server. Process-wide switches.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int selected_port = 0;
  builder.AddListeningPort(
      options_.listen,
      secure_ ? options_.credentials : grpc::InsecureServerCredentials(), &selected_port);
  builder.SetMaxReceiveMessageSize(options_.max_message_bytes);
  // gRPC sets SO_REUSEPORT on its listeners by default: a second server started on a port in use
  // would then bind it too, and the kernel would deal the connections between two servers, each
  // with its own budgets (and a test's server on port 0 could share its port with another that
  // binds that number explicitly). A port in use must be an error instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&budget_service_);
  builder.RegisterService(&admin_service_);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || selected_port == 0) {
    if (server_ != nullptr) server_->Shutdown();
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.listen, " (address in use or not local?)"));
  }
  port_ = selected_port;
  absl::string_view host;
  int ignored = 0;
  SplitHostPort(options_.listen, &host, &ignored);
  address_ = absl::StrCat(host, ":", port_);
  SetHealth(*server_, true);
  return absl::OkStatus();
}

void BudgetServer::SetServing(bool serving) {
  MutexLock lock(&mu_);
  if (shut_down_ || server_ == nullptr) return;
  SetHealth(*server_, serving);
}

BudgetServer::~BudgetServer() { Shutdown(absl::ZeroDuration()); }

void BudgetServer::Shutdown(absl::Duration grace) {
  MutexLock lock(&mu_);
  if (shut_down_ || server_ == nullptr) return;  // null: Init() could not listen
  shut_down_ = true;
  // Health checks say NOT_SERVING while in-flight RPCs drain (load balancers stop sending).
  SetHealth(*server_, false);
  // grpc::Server::Shutdown(deadline) alone would also wait for idle client connections to
  // close after its GOAWAY, which an idle synchronous client only notices at its next poll (up
  // to 5 s later). So drain first: refuse new RPCs, wait for exactly the ones in flight, then
  // shut down with an expired deadline, which cancels leftovers and closes connections at once.
  const absl::Time deadline = absl::Now() + grace;
  in_flight_.StartDraining();
  in_flight_.WaitIdle(deadline);
  server_->Shutdown(absl::ToChronoTime(absl::Now()));
}

}  // namespace retrybudget
