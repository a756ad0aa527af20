// A unary RPC's request and response on one protobuf arena whose first block comes with the
// object: parsing the request, building the response and freeing both are a few bump
// allocations instead of a malloc per submessage (a string longer than std::string's inline 15
// characters still takes one). Used by the bench's completion-queue servers (load_servers.cc);
// the real server reuses each thread's messages instead (server/reused_messages.h).
#ifndef RETRYBUDGET_BENCH_ARENA_MESSAGES_H_
#define RETRYBUDGET_BENCH_ARENA_MESSAGES_H_

#include <cstddef>

#include "google/protobuf/arena.h"

namespace retrybudget {

// Not copyable or movable (the messages point into it). Thread-compatible.
template <typename Request, typename Response>
class ArenaMessages {
 public:
  ArenaMessages()
      : arena_(Options(initial_block_, sizeof(initial_block_))),
        request_(google::protobuf::Arena::CreateMessage<Request>(&arena_)),
        response_(google::protobuf::Arena::CreateMessage<Response>(&arena_)) {}
  ArenaMessages(const ArenaMessages&) = delete;
  ArenaMessages& operator=(const ArenaMessages&) = delete;

  Request* request() { return request_; }
  Response* response() { return response_; }

 private:
  static google::protobuf::ArenaOptions Options(char* block, size_t size) {
    google::protobuf::ArenaOptions options;
    options.initial_block = block;
    options.initial_block_size = size;
    return options;
  }

  // Enough for a Sync request and response of about 16 tenant entries; larger ones grow the
  // arena.
  alignas(std::max_align_t) char initial_block_[4096];
  google::protobuf::Arena arena_;  // after initial_block_: destroyed before it
  Request* const request_;
  Response* const response_;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_BENCH_ARENA_MESSAGES_H_
