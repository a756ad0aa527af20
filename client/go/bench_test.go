package retrybudget

import (
	"sync/atomic"
	"testing"
	"time"
)

// The hot path against a bare atomic.AddInt64 in the same run (docs/BENCHMARKS.md):
//
//	build/client/go/bin/retrybudget_bench.test -test.run '^$' -test.bench . -test.count 5
//
// (a binary built without -race by the target retrybudget_go).

func benchBudget(b *testing.B) *TenantBudget {
	t := newTenantBudget("bench", func() {}, time.Time{}, fallbackConfig{})
	t.lease.deposit(maxLeaseTokens, 0)
	if uint64(b.N) >= maxLeaseTokens {
		b.Skip("b.N exceeds one lease word")
	}
	return t
}

func BenchmarkAtomicAddInt64(b *testing.B) {
	var n int64
	for i := 0; i < b.N; i++ {
		atomic.AddInt64(&n, 1)
	}
}

func BenchmarkTryAcquire(b *testing.B) {
	t := benchBudget(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if !t.TryAcquire() {
			b.Fatal("denied")
		}
	}
}

func BenchmarkRecordSuccess(b *testing.B) {
	t := benchBudget(b)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t.RecordSuccess()
	}
}

func BenchmarkTryAcquireDenied(b *testing.B) {
	t := newTenantBudget("bench", func() {}, time.Time{}, fallbackConfig{})
	t.syncWanted.Store(true) // a wake is pending, as on an empty lease after the first denial
	for i := 0; i < b.N; i++ {
		if t.TryAcquire() {
			b.Fatal("allowed from a closed word")
		}
	}
}

func BenchmarkAtomicAddInt64Parallel(b *testing.B) {
	var n int64
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			atomic.AddInt64(&n, 1)
		}
	})
}

func BenchmarkTryAcquireParallel(b *testing.B) {
	t := benchBudget(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t.TryAcquire()
		}
	})
}

func BenchmarkRecordSuccessParallel(b *testing.B) {
	t := benchBudget(b)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t.RecordSuccess()
		}
	})
}
