// The tokens this process holds for one tenant: the only state the hot path touches.
#ifndef RETRYBUDGET_CLIENT_LEASE_H_
#define RETRYBUDGET_CLIENT_LEASE_H_

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace retrybudget::client_internal {

// One 64-bit atomic word, so that taking a token is a single compare-and-swap loop that never
// lets the count go below zero:
//
//   bits  0-31  tokens held (a count, never negative)
//   bits 32-62  low-water mark: the take that brings the count from above it to it or below
//               reports kTakenLow, so the refresher is woken to refresh early (the mark is ~20%
//               of the last grant)
//   bit  63     closed: no token may be taken (no lease yet, expired, refused, fallback =
//               deny, shut down); tokens that sit in a closed word (a Refund() racing with a
//               withdrawal) cannot be taken
//
// The word holds either leased tokens or, while the server is unreachable, tokens the refresher
// puts in from the local fallback bucket: the hot path cannot tell them apart (TenantLedger
// keeps the books of each).
//
// Packing the mark and the closed bit into the counter keeps TryTake() at exactly one atomic
// operation: no second load to learn whether to wake the refresher or whether the lease is live.
//
// Thread-safe: every method may be called from any thread at any time. In practice TryTake()
// and Refund() are called by workers, Deposit() and WithdrawAndClose() by the refresher.
class alignas(64) Lease {
 public:
  // Most tokens a lease holds; a deposit beyond it is cut (see Deposit()). A grant is at most
  // 1,000,000 tokens and the client asks only for what it lacks, so this is never reached.
  static constexpr uint64_t kMaxTokens = (uint64_t{1} << 31) - 1;
  static constexpr uint64_t kMaxMark = (uint64_t{1} << 31) - 1;

  enum class Take {
    kTaken,     // the tokens were taken
    kTakenLow,  // the tokens were taken and the count fell to the low-water mark or below it
    kEmpty,     // nothing taken: fewer tokens than the cost, or the lease is closed
  };

  Lease() = default;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;

  // Takes `cost` tokens (>= 1) if the lease is open and holds at least that many: all or
  // nothing, never a partial take. Lock-free: one CAS loop, no allocation, no clock read.
  //
  // Why a CAS and not one fetch_sub (lock xadd, ~1.6x faster uncontended): an unconditional
  // decrement of an empty word borrows into the mark (or, with the count moved to the high
  // half, leaves it at -1 until the failed taker adds the token back). In that window other
  // workers, Held(), and the refresher's Replace()/WithdrawAndClose() exchanges see a count that
  // is not the tokens held: an exchange would report the debt as tokens taken out, and the
  // failed taker's later undo would put a token that was never granted into a closed word,
  // which the refresher then reports as returned (the server's "leased spent + returned <=
  // received" check fails). Keeping the word exact needs every exchange to carry the in-flight
  // debts over (a CAS loop of its own), and a denial costs two atomics; not worth it for a
  // path that is already one uncontended lock cmpxchg.
  Take TryTake(uint32_t cost = 1) noexcept {
    uint64_t word = word_.load(std::memory_order_relaxed);
    while (Spendable(word, cost)) {
      if (word_.compare_exchange_weak(word, word - cost, std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
        const uint64_t mark = Mark(word);
        return Tokens(word) > mark && Tokens(word) - cost <= mark ? Take::kTakenLow
                                                                  : Take::kTaken;
      }
    }
    return Take::kEmpty;
  }

  // Puts back `cost` tokens taken by TryTake(). One atomic add. If the lease was closed in the
  // meantime the tokens stay unspendable until the refresher withdraws them.
  void Refund(uint32_t cost = 1) noexcept { word_.fetch_add(cost, std::memory_order_acq_rel); }

  // Adds up to `tokens` tokens (the count is capped at kMaxTokens), sets the low-water mark to
  // `mark` and opens the lease. Returns how many tokens were actually added; the caller must
  // account for the rest as given back.
  uint64_t Deposit(uint64_t tokens, uint64_t mark) noexcept {
    mark = std::min(mark, kMaxMark);
    uint64_t word = word_.load(std::memory_order_relaxed);
    uint64_t added = 0;
    uint64_t next = 0;
    do {
      const uint64_t held = Tokens(word);
      added = held >= kMaxTokens ? 0 : std::min(tokens, kMaxTokens - held);
      next = (held + added) | (mark << kMarkShift);
    } while (!word_.compare_exchange_weak(word, next, std::memory_order_acq_rel,
                                          std::memory_order_relaxed));
    return added;
  }

  // Takes every token out and puts min(`tokens`, kMaxTokens) in, with low-water mark `mark`,
  // open: one atomic exchange, so workers never see an empty word in between (used to switch
  // between leased and fallback tokens). Returns the number of tokens taken out; the caller
  // accounts for Capped(tokens) as added.
  uint64_t Replace(uint64_t tokens, uint64_t mark) noexcept {
    const uint64_t next = Capped(tokens) | (std::min(mark, kMaxMark) << kMarkShift);
    return Tokens(word_.exchange(next, std::memory_order_acq_rel));
  }

  // How many of `tokens` a Replace() puts in.
  static constexpr uint64_t Capped(uint64_t tokens) { return std::min(tokens, kMaxTokens); }

  // Closes the lease and takes every token out of it (one atomic exchange). Returns the number
  // of tokens taken out.
  uint64_t WithdrawAndClose() noexcept {
    return Tokens(word_.exchange(kClosedBit, std::memory_order_acq_rel));
  }

  // Tokens in the lease right now (spendable or not).
  uint64_t Held() const noexcept { return Tokens(word_.load(std::memory_order_acquire)); }

  // True when a lease is in force (tokens in it may be taken).
  bool IsOpen() const noexcept {
    return (word_.load(std::memory_order_acquire) & kClosedBit) == 0;
  }

 private:
  static constexpr int kMarkShift = 32;
  static constexpr uint64_t kTokenMask = (uint64_t{1} << kMarkShift) - 1;
  static constexpr uint64_t kClosedBit = uint64_t{1} << 63;

  static constexpr uint64_t Tokens(uint64_t word) { return word & kTokenMask; }
  static constexpr uint64_t Mark(uint64_t word) { return (word & ~kClosedBit) >> kMarkShift; }
  static constexpr bool Spendable(uint64_t word, uint32_t cost) {
    return (word & kClosedBit) == 0 && Tokens(word) >= cost;
  }

  // Starts closed: no lease until the first grant arrives.
  std::atomic<uint64_t> word_{kClosedBit};
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_LEASE_H_
