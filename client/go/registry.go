package retrybudget

import "sync"

// tenantRegistry is the tenants a client knows, by name, in creation order. Thread-safe.
type tenantRegistry struct {
	clock  Clock
	waker  func()
	fb     fallbackConfig
	costs  *costLogger
	mu     sync.Mutex
	byName map[string]*TenantBudget
	order  []*TenantBudget
	closed bool
}

func newTenantRegistry(clock Clock, waker func(), fb fallbackConfig, logger Logger) *tenantRegistry {
	return &tenantRegistry{clock: clock, waker: waker, fb: fb,
		costs: &costLogger{clock: clock, logger: logger}, byName: map[string]*TenantBudget{}}
}

func (r *tenantRegistry) getOrCreate(name string) (*TenantBudget, error) {
	r.mu.Lock()
	if b, ok := r.byName[name]; ok {
		r.mu.Unlock()
		return b, nil
	}
	if err := checkTenantName(name); err != nil {
		r.mu.Unlock()
		return nil, err
	}
	if r.closed {
		r.mu.Unlock()
		return nil, ErrClientClosed
	}
	if len(r.order) >= maxTenantsPerClient {
		r.mu.Unlock()
		return nil, invalidf("tenant %q would be tenant number %d; one client may use at most %d",
			name, len(r.order)+1, maxTenantsPerClient)
	}
	b := newTenantBudget(name, r.waker, r.clock.Now(), r.fb)
	b.costLog = r.costs
	r.byName[name] = b
	r.order = append(r.order, b)
	r.mu.Unlock()
	r.waker() // its first lease is asked for at once
	return b, nil
}

func (r *tenantRegistry) snapshot() []*TenantBudget {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*TenantBudget(nil), r.order...)
}

func (r *tenantRegistry) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
}
