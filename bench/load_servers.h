// The servers the server-load bench (server_load_bench.cc) measures besides the real
// retry-budget-server binary. Each runs in a child process (the bench binary with --serve=...),
// prints its port on stdout and serves until its stdin closes.
//
//   echo_callback  the baseline: an echo service on the callback API (the API of the real server)
//   echo_cq        the same echo service on the async completion-queue API
//   budget_cq      a real BudgetCore (the same library as the server) behind a Sync handler on
//                  the async completion-queue API
//
// With the real server (callback API) they answer the question the issue asks: what does the
// budget logic cost next to bare gRPC, and would the completion-queue API serve Syncs faster?
#ifndef RETRYBUDGET_BENCH_LOAD_SERVERS_H_
#define RETRYBUDGET_BENCH_LOAD_SERVERS_H_

#include <string>

namespace retrybudget::bench {

// Serves `kind` (one of the names above) on 127.0.0.1:0 with `cq_threads` completion-queue
// threads (CQ kinds only; the callback API sizes its own pool). Returns the process exit code:
// 0 after a clean shutdown, 2 for an unknown kind, 1 when the server cannot start.
int Serve(const std::string& kind, int cq_threads);

}  // namespace retrybudget::bench

#endif  // RETRYBUDGET_BENCH_LOAD_SERVERS_H_
