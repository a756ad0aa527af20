// A unary RPC's request and response, kept per thread and reused by the next RPC the thread
// handles: once a thread has served a request of a given shape, parsing the next one and
// answering it allocate nothing. A cleared protobuf message keeps its repeated submessages and
// the capacity of its strings, so a Sync naming 8 tenants called "service-012.prod" (16
// characters, one more than std::string keeps inline) no longer makes 17 heap blocks (8 names
// parsed, 8 copied into the response, the instance id) and an arena per call.
//
// Used by the server's Sync (service.cc). A lease whose request was larger than
// kKeepRequestBytes drops the thread's messages when it ends, so a thread keeps what an
// ordinary request needs and no more, whatever a hostile one made it grow to. A second lease on
// a thread that still holds one (nothing in the server nests RPCs, but gRPC could run a handler
// from inside another's call into it) gets messages of its own.
#ifndef RETRYBUDGET_SERVER_REUSED_MESSAGES_H_
#define RETRYBUDGET_SERVER_REUSED_MESSAGES_H_

#include <cstddef>
#include <memory>

namespace retrybudget {

template <typename Message>
void ClearMessage(Message* message) {
  message->Clear();
}

// Not copyable or movable. Thread-compatible: a lease is used by the thread that made it.
// `kClearResponse` empties the kept response for the next lease: Clear(), or a function that
// also keeps what Clear() would free (ClearForReuse in replay_cache.h, for a SyncResponse).
template <typename Request, typename Response,
          void (*kClearResponse)(Response*) = &ClearMessage<Response>>
class ReusedMessages {
 public:
  // Requests up to this size leave their messages to the thread's next lease. An ordinary Sync
  // is a few hundred bytes (8 entries: ~400); 4 KiB holds ~60 entries of ordinary names. The
  // most a thread can keep is what a request of this size parses into: a cleared repeated field
  // keeps its elements, and 4 KiB of empty entries (2 bytes each) is ~2,000 of them, ~200 KB.
  static constexpr size_t kKeepRequestBytes = 4 * 1024;

  // `request_bytes`: the size of the encoded request this lease will parse.
  explicit ReusedMessages(size_t request_bytes) : keep_(request_bytes <= kKeepRequestBytes) {
    std::unique_ptr<Pair>& slot = ThreadSlot();
    if (slot != nullptr && !slot->in_use) {
      pair_ = slot.get();
      pair_->request.Clear();
      kClearResponse(&pair_->response);
    } else if (slot == nullptr && keep_) {
      slot = std::make_unique<Pair>();
      pair_ = slot.get();
    } else {
      own_ = std::make_unique<Pair>();
      pair_ = own_.get();
    }
    pair_->in_use = true;
  }
  ~ReusedMessages() {
    pair_->in_use = false;
    if (own_ == nullptr && !keep_) ThreadSlot().reset();
  }
  ReusedMessages(const ReusedMessages&) = delete;
  ReusedMessages& operator=(const ReusedMessages&) = delete;

  Request* request() { return &pair_->request; }
  Response* response() { return &pair_->response; }
  // Whether this lease uses the thread's kept messages (tests).
  bool reused_thread_slot() const { return own_ == nullptr; }

 private:
  struct Pair {
    Request request;
    Response response;
    bool in_use = false;
  };
  static std::unique_ptr<Pair>& ThreadSlot() {
    static thread_local std::unique_ptr<Pair> slot;
    return slot;
  }

  const bool keep_;
  std::unique_ptr<Pair> own_;  // set when the thread's slot was busy
  Pair* pair_ = nullptr;
};

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_REUSED_MESSAGES_H_
