// The refresher's books for one tenant: what went into the lease and what came out, turned
// into the cumulative counters a Sync reports.
#ifndef RETRYBUDGET_CLIENT_TENANT_LEDGER_H_
#define RETRYBUDGET_CLIENT_TENANT_LEDGER_H_

#include <cstdint>

namespace retrybudget::client_internal {

// Workers never count what they spend: the refresher knows everything it put into the lease
// (tokens received) and took out of it (tokens withdrawn), so with `held` read from the lease,
//
//     spent = received - withdrawn - held
//
// counts every TryAcquire() that took a token minus every Refund() (a refund puts the token back
// into the lease, so it is simply not spent).
//
// A Sync carries cumulative counters that must never go backwards, but a Refund() that comes
// after a report lowers `spent`. So the reported `retries_spent` is held at its last value until
// the real count catches up (the refunded token is spent again), and when such a token is
// withdrawn instead (the lease expired), it is "absorbed": counted as spent rather than returned.
// The wire then always satisfies
//
//     retries_spent + tokens_returned + held == tokens_received
//
// and over-counts spending only by refunded-then-expired tokens (the safe direction).
//
// Not thread-safe: the owner serialises calls (TenantBudgetImpl holds its mutex).
class TenantLedger {
 public:
  // `granted` tokens arrived in a response; `deposited` of them went into the lease (the rest
  // was cut by the lease's cap and counts as returned at once).
  void Received(uint64_t granted, uint64_t deposited);

  // `withdrawn` tokens were taken out of the lease (expiry, refusal, shutdown); `held_after` is
  // what the lease holds right after (normally 0; more if a Refund() raced in).
  void Withdrew(uint64_t withdrawn, uint64_t held_after);

  // The cumulative `retries_spent` to report while the lease holds `held` tokens, and remembers
  // it as reported (the next report is never lower).
  uint64_t ReportSpent(uint64_t held);

  // Retries really spent (TryAcquire() minus Refund()), for Stats. Not monotonic.
  uint64_t ExactSpent(uint64_t held) const;

  uint64_t received() const { return received_; }
  uint64_t returned() const { return returned_; }
  uint64_t reported_spent() const { return reported_spent_; }

 private:
  // spent + returned as the wire sees them: received - returned - held (absorbed tokens count
  // as spent). Saturates at 0.
  uint64_t WireSpent(uint64_t held) const;

  uint64_t received_ = 0;        // tokens granted and received
  uint64_t returned_ = 0;        // tokens given back (withdrawn and not absorbed, or cut)
  uint64_t absorbed_ = 0;        // withdrawn tokens reported as spent (see class comment)
  uint64_t reported_spent_ = 0;  // last retries_spent reported
};

}  // namespace retrybudget::client_internal

#endif  // RETRYBUDGET_CLIENT_TENANT_LEDGER_H_
