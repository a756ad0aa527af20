#include "bench/load_servers.h"

#include <cstdio>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "bench/arena_messages.h"
#include "bench/bench_util.h"
#include "bench/echo.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "retrybudget/v1/budget.grpc.pb.h"
#include "server/budget_core.h"
#include "server/policy.h"
#include "server/service.h"

namespace retrybudget::bench {
namespace {

// The echo handler of both APIs: a response of the requested size.
void AnswerEcho(const EchoRequest& request, EchoResponse* response) {
  response->mutable_payload()->assign(request.response_bytes(), 'x');
}

class CallbackEchoService final : public EchoService::CallbackService {
 public:
  grpc::ServerUnaryReactor* Echo(grpc::CallbackServerContext* context, const EchoRequest* request,
                                 EchoResponse* response) override {
    AnswerEcho(*request, response);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
};

// One unary method served on the completion-queue API, the classic way: each CQ thread keeps
// kPendingPerQueue calls requested; a completed request is answered inline on that thread and
// replaced by a new one. Request and response live on an arena of their own per call, as in the
// callback server (service.cc), so the two APIs differ only in how calls are delivered.
template <typename Request, typename Response>
class CqUnaryMethod {
 public:
  using Writer = grpc::ServerAsyncResponseWriter<Response>;
  // Asks gRPC for the next call of the method (the generated AsyncService::RequestX).
  using RequestCall = std::function<void(grpc::ServerContext*, Request*, Writer*,
                                         grpc::ServerCompletionQueue*, void*)>;
  using Handler = std::function<grpc::Status(const Request&, Response*)>;

  CqUnaryMethod(RequestCall request_call, Handler handler)
      : request_call_(std::move(request_call)), handler_(std::move(handler)) {}

  // Serves calls from `cq` until it is shut down and drained.
  void Run(grpc::ServerCompletionQueue* cq) {
    for (int i = 0; i < kPendingPerQueue; ++i) Post(cq);
    void* tag = nullptr;
    bool ok = false;
    while (cq->Next(&tag, &ok)) {
      auto* call = static_cast<Call*>(tag);
      if (call->answered || !ok) {  // finished, or the server is shutting down
        delete call;
        continue;
      }
      Post(cq);
      const grpc::Status status = handler_(*call->request, call->response);
      call->answered = true;
      if (status.ok()) {
        call->writer.Finish(*call->response, status, call);
      } else {
        call->writer.FinishWithError(status, call);
      }
    }
  }

 private:
  static constexpr int kPendingPerQueue = 128;

  struct Call {
    Call() : request(messages.request()), response(messages.response()), writer(&context) {}

    ArenaMessages<Request, Response> messages;
    Request* const request;
    Response* const response;
    grpc::ServerContext context;
    Writer writer;
    bool answered = false;
  };

  void Post(grpc::ServerCompletionQueue* cq) {
    auto* call = new Call();
    request_call_(&call->context, call->request, &call->writer, cq, call);
  }

  const RequestCall request_call_;
  const Handler handler_;
};

// Prints the port, serves until stdin closes, shuts down. `cqs` (may be empty) are drained by
// `cq_threads` running `serve_cq`.
int ServeUntilStdinCloses(grpc::ServerBuilder& builder, int cq_threads,
                          const std::function<void(grpc::ServerCompletionQueue*)>& serve_cq) {
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  if (serve_cq) {
    for (int i = 0; i < cq_threads; ++i) cqs.push_back(builder.AddCompletionQueue());
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return 1;
  std::vector<std::thread> threads;
  for (auto& cq : cqs) threads.emplace_back([&serve_cq, q = cq.get()] { serve_cq(q); });
  std::printf("%d\n", port);
  std::fflush(stdout);
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  server->Shutdown(std::chrono::system_clock::now());
  for (auto& cq : cqs) cq->Shutdown();
  for (auto& t : threads) t.join();
  return 0;
}

int ServeEchoCallback() {
  CallbackEchoService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  return ServeUntilStdinCloses(builder, 0, nullptr);
}

int ServeEchoCq(int cq_threads) {
  EchoService::AsyncService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  CqUnaryMethod<EchoRequest, EchoResponse> echo(
      [&service](grpc::ServerContext* context, EchoRequest* request,
                 grpc::ServerAsyncResponseWriter<EchoResponse>* writer,
                 grpc::ServerCompletionQueue* cq, void* tag) {
        service.RequestEcho(context, request, writer, cq, cq, tag);
      },
      [](const EchoRequest& request, EchoResponse* response) {
        AnswerEcho(request, response);
        return grpc::Status::OK;
      });
  return ServeUntilStdinCloses(builder, cq_threads,
                               [&echo](grpc::ServerCompletionQueue* cq) { echo.Run(cq); });
}

int ServeBudgetCq(int cq_threads) {
  absl::StatusOr<v1::PolicyConfig> policy = ParsePolicyConfig(kUnlimitedPolicy);
  if (!policy.ok()) return 1;
  absl::StatusOr<std::unique_ptr<BudgetCore>> core = BudgetCore::Create({.policy = *policy});
  if (!core.ok()) return 1;
  v1::RetryBudgetService::AsyncService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  CqUnaryMethod<v1::SyncRequest, v1::SyncResponse> sync(
      [&service](grpc::ServerContext* context, v1::SyncRequest* request,
                 grpc::ServerAsyncResponseWriter<v1::SyncResponse>* writer,
                 grpc::ServerCompletionQueue* cq, void* tag) {
        service.RequestSync(context, request, writer, cq, cq, tag);
      },
      [&core](const v1::SyncRequest& request, v1::SyncResponse* response) {
        return ToGrpcStatus((*core)->Sync(request, response));
      });
  return ServeUntilStdinCloses(builder, cq_threads,
                               [&sync](grpc::ServerCompletionQueue* cq) { sync.Run(cq); });
}

}  // namespace

int Serve(const std::string& kind, int cq_threads) {
  // The same process setting as retry-budget-server (server/main.cc), so the servers differ only
  // in their API and handlers.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (kind == "echo_callback") return ServeEchoCallback();
  if (kind == "echo_cq") return ServeEchoCq(cq_threads);
  if (kind == "budget_cq") return ServeBudgetCq(cq_threads);
  std::fprintf(stderr, "--serve=%s: expected echo_callback, echo_cq or budget_cq\n", kind.c_str());
  return 2;
}

}  // namespace retrybudget::bench
