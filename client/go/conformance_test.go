package retrybudget

// The Go runner of the client conformance corpus (client/conformance/README.md): every
// scenario of client/conformance/scenarios runs through the real engine (sync_engine.go), its
// driver (the refresher's runOnce) and tenant budgets (the code a worker runs), with only the
// clock (FakeClock) and the transport (a scripted Sync stub) replaced. One subtest per scenario
// file. Strict: an unknown key anywhere fails the scenario, each Sync request is compared whole
// (proto3 defaults for fields not written), and a step must send exactly the attempts it lists.
//
// The corpus is found through RETRYBUDGET_CONFORMANCE_SCENARIOS, else next to this file's
// real location (client/go/../conformance/scenarios, following the build tree's symlinks).
//
// The attempt's wait-for-ready is read from the call options (grpc.WaitForReady); its timeout
// from the value the refresher's send puts in the context (the deadline itself is real time).
// The final Sync's backoff between attempts is real time in this client (Close never waits on a
// test's FakeClock): the fake clock moves only by the attempts' after_ms.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var conformanceEpoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

func conformanceDir(t *testing.T) string {
	if d := os.Getenv("RETRYBUDGET_CONFORMANCE_SCENARIOS"); d != "" {
		return d
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate conformance_test.go; set RETRYBUDGET_CONFORMANCE_SCENARIOS")
	}
	if real, err := filepath.EvalSymlinks(file); err == nil {
		file = real
	}
	return filepath.Join(filepath.Dir(file), "..", "conformance", "scenarios")
}

// ruleIDs are the ids RULES.md defines ("- `id`: ...").
func ruleIDs(t *testing.T, scenarios string) map[string]bool {
	text, err := os.ReadFile(filepath.Join(scenarios, "..", "RULES.md"))
	if err != nil {
		t.Fatalf("reading the rulebook: %v", err)
	}
	ids := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^- `([a-z0-9.-]+)`:").FindAllStringSubmatch(string(text), -1) {
		ids[m[1]] = true
	}
	if len(ids) == 0 {
		t.Fatal("RULES.md defines no rule ids")
	}
	return ids
}

func TestConformance(t *testing.T) {
	dir := conformanceDir(t)
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios in %s (%v)", dir, err)
	}
	sort.Strings(files)
	rules := ruleIDs(t, dir)
	for _, f := range files {
		f := f
		t.Run(strings.TrimSuffix(filepath.Base(f), ".json"), func(t *testing.T) {
			runScenarioFile(t, f, rules)
		})
	}
}

// ---- the scenario format ----

type scenarioOptions struct {
	InstanceID              *string  `json:"instance_id"`
	RefreshPeriodMs         *float64 `json:"refresh_period_ms"`
	MinSyncIntervalMs       *float64 `json:"min_sync_interval_ms"`
	LeaseBurst              *uint64  `json:"lease_burst"`
	SyncTimeoutMs           *float64 `json:"sync_timeout_ms"`
	Fallback                *string  `json:"fallback"`
	FallbackCapacity        *float64 `json:"fallback_capacity"`
	FallbackRefillPerSecond *float64 `json:"fallback_refill_per_second"`
}

type scenario struct {
	Name        string                       `json:"name"`
	Rules       []string                     `json:"rules"`
	Description string                       `json:"description"`
	Options     scenarioOptions              `json:"options"`
	Steps       []map[string]json.RawMessage `json:"steps"`
}

type scenarioAttempt struct {
	Expect              json.RawMessage `json:"expect"`
	ExpectAddress       *string         `json:"expect_address"`
	ExpectTimeoutMs     *float64        `json:"expect_timeout_ms"`
	ExpectWaitForReady  *bool           `json:"expect_wait_for_ready"`
	AfterMs             *float64        `json:"after_ms"`
	Response            json.RawMessage `json:"response"`
	Error               *string         `json:"error"`
	Message             *string         `json:"message"`
	Lost                *bool           `json:"lost"`
	parsedExpect        *pb.SyncRequest
	parsedResponse      *pb.SyncResponse
	parsedErrorCode     codes.Code
	description         string
	checkAddressDefault bool
}

type scenarioRun struct {
	Attempts   *[]*scenarioAttempt `json:"attempts"`
	NextWakeMs json.RawMessage     `json:"next_wake_ms"`
}

type scenarioShutdown struct {
	Attempts     *[]*scenarioAttempt `json:"attempts"`
	ExpectStatus *string             `json:"expect_status"`
}

type tenantExpectation struct {
	Mode                     *string `json:"mode"`
	Shadow                   *bool   `json:"shadow"`
	TokensHeld               *int64  `json:"tokens_held"`
	RetriesAllowed           *uint64 `json:"retries_allowed"`
	RetriesDenied            *uint64 `json:"retries_denied"`
	ShadowDenied             *uint64 `json:"shadow_denied"`
	Requests                 *uint64 `json:"requests"`
	RequestsCreditedLocally  *uint64 `json:"requests_credited_locally"`
	FallbackAllowed          *uint64 `json:"fallback_allowed"`
	Successes                *uint64 `json:"successes"`
	SuccessesCreditedLocally *uint64 `json:"successes_credited_locally"`
	TokensReceived           *uint64 `json:"tokens_received"`
	TokensReturned           *uint64 `json:"tokens_returned"`
	Refunds                  *uint64 `json:"refunds"`
	Error                    *string `json:"error"`
}

// strictUnmarshal decodes `data` into `v`, failing on a key `v` does not have.
func strictUnmarshal(data []byte, v interface{}) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	d.UseNumber()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("trailing data after the JSON value")
	}
	return nil
}

func msToDuration(ms float64) time.Duration {
	return time.Duration(math.Round(ms * float64(time.Millisecond)))
}

func durationToMs(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

var codeByName = func() map[string]codes.Code {
	m := map[string]codes.Code{}
	for c, n := range codeNames {
		m[n] = c
	}
	m["CANCELED"] = codes.Canceled
	return m
}()

var modeNames = map[leaseMode]string{
	awaitingLease: "awaiting_lease", leased: "leased", expired: "expired", refused: "refused",
	inFallback: "fallback", inDenyFallback: "deny_fallback", shutdown: "shutdown",
}

func scenarioClientOptions(o scenarioOptions, clock Clock) (ClientOptions, error) {
	c := DefaultClientOptions()
	c.Target = "conformance:0"
	c.Clock = clock
	c.Logger = log.New(io.Discard, "", 0)
	c.InstanceID = "conformance"
	if o.InstanceID != nil {
		c.InstanceID = *o.InstanceID
	}
	if o.RefreshPeriodMs != nil {
		c.RefreshPeriod = msToDuration(*o.RefreshPeriodMs)
	}
	if o.MinSyncIntervalMs != nil {
		c.MinSyncInterval = msToDuration(*o.MinSyncIntervalMs)
	}
	if o.LeaseBurst != nil {
		c.LeaseBurst = *o.LeaseBurst
	}
	if o.SyncTimeoutMs != nil {
		c.SyncTimeout = msToDuration(*o.SyncTimeoutMs)
	}
	if o.Fallback != nil {
		switch *o.Fallback {
		case "local_bucket":
			c.Fallback = FallbackLocalBucket
		case "deny":
			c.Fallback = FallbackDeny
		default:
			return c, fmt.Errorf("options.fallback is %q; expected local_bucket or deny", *o.Fallback)
		}
	}
	if o.FallbackCapacity != nil {
		c.FallbackCapacity = *o.FallbackCapacity
	}
	if o.FallbackRefillPerSecond != nil {
		c.FallbackRefillPerSecond = *o.FallbackRefillPerSecond
	}
	return validateAndDefault(c)
}

// parseAttempts checks and decodes each attempt's expect and outcome.
func parseAttempts(attempts []*scenarioAttempt, instanceID string, redirects bool) error {
	for i, a := range attempts {
		if a == nil {
			return fmt.Errorf("attempt %d is null", i+1)
		}
		if len(a.Expect) == 0 {
			return fmt.Errorf("attempt %d has no expect", i+1)
		}
		a.parsedExpect = &pb.SyncRequest{}
		if err := protojson.Unmarshal(a.Expect, a.parsedExpect); err != nil {
			return fmt.Errorf("attempt %d: expect: %v", i+1, err)
		}
		if a.parsedExpect.InstanceId == "" {
			a.parsedExpect.InstanceId = instanceID
		}
		a.checkAddressDefault = a.ExpectAddress == nil && !redirects
		outcomes := 0
		if len(a.Response) > 0 {
			outcomes++
			a.parsedResponse = &pb.SyncResponse{}
			if err := protojson.Unmarshal(a.Response, a.parsedResponse); err != nil {
				return fmt.Errorf("attempt %d: response: %v", i+1, err)
			}
		}
		if a.Error != nil {
			outcomes++
			c, ok := codeByName[*a.Error]
			if !ok || c == codes.OK {
				return fmt.Errorf("attempt %d: error %q is not a gRPC code name other than OK", i+1, *a.Error)
			}
			a.parsedErrorCode = c
		}
		if a.Lost != nil {
			if !*a.Lost {
				return fmt.Errorf("attempt %d: lost may only be true", i+1)
			}
			if a.AfterMs != nil {
				return fmt.Errorf("attempt %d: lost with after_ms", i+1)
			}
			outcomes++
		}
		if outcomes != 1 {
			return fmt.Errorf("attempt %d has %d outcomes (response, error, lost); exactly one is needed", i+1, outcomes)
		}
		if a.Message != nil && a.Error == nil {
			return fmt.Errorf("attempt %d: message without error", i+1)
		}
		if a.AfterMs != nil && *a.AfterMs < 0 {
			return fmt.Errorf("attempt %d: after_ms is %v", i+1, *a.AfterMs)
		}
	}
	return nil
}

// ---- the scripted transport ----

// scriptedTransport answers the Sync attempts of one step with the step's script and checks
// each request against it. The refresher calls it synchronously from the step (runOnce, Close).
type scriptedTransport struct {
	clock    *FakeClock
	attempts []*scenarioAttempt
	next     int
	where    string
	problems []string
}

func (s *scriptedTransport) failf(format string, args ...interface{}) {
	s.problems = append(s.problems, fmt.Sprintf(format, args...))
}

func (s *scriptedTransport) begin(where string, attempts []*scenarioAttempt) {
	s.where, s.attempts, s.next, s.problems = where, attempts, 0, nil
}

// end lists what went wrong in the step (attempts not sent included).
func (s *scriptedTransport) end() []string {
	if s.next < len(s.attempts) {
		s.failf("%s: %d attempts sent, %d expected", s.where, s.next, len(s.attempts))
	}
	s.attempts = nil
	return s.problems
}

func jsonOf(m proto.Message) string {
	b, err := protojson.MarshalOptions{EmitUnpopulated: false, UseProtoNames: true}.Marshal(m)
	if err != nil {
		return fmt.Sprintf("<%v>", err)
	}
	return string(b)
}

func (s *scriptedTransport) sync(address string, ctx context.Context, req *pb.SyncRequest, opts []grpc.CallOption) (*pb.SyncResponse, error) {
	n := s.next
	s.next++
	if n >= len(s.attempts) {
		s.failf("%s: attempt %d sent, only %d expected: %s (address %q)", s.where, n+1,
			len(s.attempts), jsonOf(req), address)
		return nil, status.Error(codes.Unavailable, "conformance: attempt not in the script")
	}
	a := s.attempts[n]
	where := fmt.Sprintf("%s attempt %d", s.where, n+1)
	if !proto.Equal(req, a.parsedExpect) {
		s.failf("%s: request differs\n   sent:     %s\n   expected: %s", where, jsonOf(req),
			jsonOf(a.parsedExpect))
	}
	if a.ExpectAddress != nil && *a.ExpectAddress != address {
		s.failf("%s: sent to %q, expected %q", where, address, *a.ExpectAddress)
	}
	if a.checkAddressDefault && address != "" {
		s.failf("%s: sent to %q, expected the main target", where, address)
	}
	timeout, ok := ctx.Value(attemptTimeoutKey{}).(time.Duration)
	if !ok {
		s.failf("%s: the attempt carries no timeout", where)
	}
	if a.ExpectTimeoutMs != nil && math.Abs(durationToMs(timeout)-*a.ExpectTimeoutMs) > 0.001 {
		s.failf("%s: timeout %v ms, expected %v ms", where, durationToMs(timeout), *a.ExpectTimeoutMs)
	}
	if a.ExpectWaitForReady != nil {
		waitForReady := false
		for _, o := range opts {
			if ff, ok := o.(grpc.FailFastCallOption); ok {
				waitForReady = !ff.FailFast
			}
		}
		if waitForReady != *a.ExpectWaitForReady {
			s.failf("%s: wait_for_ready %v, expected %v", where, waitForReady, *a.ExpectWaitForReady)
		}
	}
	sent := s.clock.Now()
	if a.Lost != nil {
		s.clock.Set(sent.Add(timeout))
		return nil, status.Error(codes.DeadlineExceeded, "conformance: response lost")
	}
	if a.AfterMs != nil {
		s.clock.Set(sent.Add(msToDuration(*a.AfterMs)))
	}
	if a.Error != nil {
		msg := "conformance: scripted error"
		if a.Message != nil {
			msg = *a.Message
		}
		return nil, status.Error(a.parsedErrorCode, msg)
	}
	return proto.Clone(a.parsedResponse).(*pb.SyncResponse), nil
}

type scriptedStub struct {
	address   string
	transport *scriptedTransport
}

func (s *scriptedStub) Sync(ctx context.Context, req *pb.SyncRequest, opts ...grpc.CallOption) (*pb.SyncResponse, error) {
	return s.transport.sync(s.address, ctx, req, opts)
}

// ---- running a scenario ----

type scenarioRunner struct {
	t         *testing.T
	sc        *scenario
	clock     *FakeClock
	transport *scriptedTransport
	client    *Client
	instance  string
	redirects bool
	tenants   map[string]*TenantBudget
}

func runScenarioFile(t *testing.T, path string, rules map[string]bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := &scenario{}
	if err := strictUnmarshal(data, sc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if want := strings.TrimSuffix(filepath.Base(path), ".json"); sc.Name != want {
		t.Fatalf("name is %q; expected the file name %q", sc.Name, want)
	}
	if len(sc.Rules) == 0 {
		t.Fatal("rules is empty")
	}
	for _, r := range sc.Rules {
		if !rules[r] {
			t.Fatalf("rule %q is not in RULES.md", r)
		}
	}
	if sc.Description == "" || len(sc.Steps) == 0 {
		t.Fatal("description or steps missing")
	}
	clock := NewFakeClock(conformanceEpoch)
	o, err := scenarioClientOptions(sc.Options, clock)
	if err != nil {
		t.Fatalf("options: %v", err)
	}
	transport := &scriptedTransport{clock: clock}
	owners := func(address string) (pb.RetryBudgetServiceClient, func(), error) {
		if err := checkOwnerAddress(address); err != nil {
			return nil, nil, err
		}
		return &scriptedStub{address: address, transport: transport}, func() {}, nil
	}
	client, err := newClient(o, &scriptedStub{transport: transport}, owners)
	if err != nil {
		t.Fatal(err)
	}
	r := &scenarioRunner{t: t, sc: sc, clock: clock, transport: transport, client: client,
		instance: o.InstanceID, redirects: bytes.Contains(data, []byte(`"owner"`)),
		tenants: map[string]*TenantBudget{}}
	for i, step := range sc.Steps {
		if err := r.step(i, step); err != nil {
			t.Fatalf("step %d (%s): %v", i+1, stepJSON(step), err)
		}
	}
}

func stepJSON(step map[string]json.RawMessage) string {
	b, _ := json.Marshal(step)
	if len(b) > 300 {
		return string(b[:300]) + "..."
	}
	return string(b)
}

var actionKeys = []string{"tenant", "try_acquire", "record_success", "record_request", "refund",
	"run", "shutdown", "expect_tenant"}

// costOutOfRange is the `expect` of a take or refund whose cost is outside [1, 1000000]: in Go
// TryAcquireN returns false and RefundN returns nothing (the later steps check that nothing
// changed).
const costOutOfRange = "cost_out_of_range"

// stepCost is the step's `cost` (1 when left out); any integer, so out-of-range costs reach
// the client.
func stepCost(step map[string]json.RawMessage) (int, error) {
	raw, ok := step["cost"]
	if !ok {
		return 1, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("cost: %v", err)
	}
	cost, err := n.Int64()
	if err != nil || cost < math.MinInt32 || cost > math.MaxInt32 {
		return 0, fmt.Errorf("cost %s is not an integer a test can pass", n)
	}
	return int(cost), nil
}

// stepExpect is a take's or refund's `expect`: true, false or "cost_out_of_range".
func stepExpect(raw json.RawMessage) (want bool, outOfRange bool, err error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if s != costOutOfRange {
			return false, false, fmt.Errorf("expect %q: expected true, false or %q", s, costOutOfRange)
		}
		return false, true, nil
	}
	if err := json.Unmarshal(raw, &want); err != nil {
		return false, false, fmt.Errorf("expect: %v", err)
	}
	return want, false, nil
}

func (r *scenarioRunner) step(i int, step map[string]json.RawMessage) error {
	rawAt, ok := step["at_ms"]
	if !ok {
		return errors.New("no at_ms")
	}
	var atMs float64
	if err := json.Unmarshal(rawAt, &atMs); err != nil {
		return fmt.Errorf("at_ms: %v", err)
	}
	at := conformanceEpoch.Add(msToDuration(atMs))
	if at.Before(r.clock.Now()) {
		return fmt.Errorf("at_ms %v is before the clock (%v ms)", atMs,
			durationToMs(r.clock.Now().Sub(conformanceEpoch)))
	}
	r.clock.Set(at)
	action := ""
	for _, k := range actionKeys {
		if _, ok := step[k]; ok {
			if action != "" {
				return fmt.Errorf("two actions: %s and %s", action, k)
			}
			action = k
		}
	}
	if action == "" {
		return errors.New("no action key")
	}
	for k := range step {
		if k == "at_ms" || k == action ||
			((k == "expect" || k == "cost") && (action == "try_acquire" || action == "refund")) {
			continue
		}
		return fmt.Errorf("unknown key %q", k)
	}
	raw := step[action]
	where := fmt.Sprintf("step %d (%s at %v ms)", i+1, action, atMs)
	switch action {
	case "tenant":
		name, err := r.name(raw)
		if err != nil {
			return err
		}
		b, err := r.client.Tenant(name)
		if err != nil {
			return err
		}
		r.tenants[name] = b
	case "try_acquire":
		b, err := r.handle(raw)
		if err != nil {
			return err
		}
		e, ok := step["expect"]
		if !ok {
			return errors.New("try_acquire without expect")
		}
		want, outOfRange, err := stepExpect(e)
		if err != nil {
			return err
		}
		cost, err := stepCost(step)
		if err != nil {
			return err
		}
		if inRange := cost >= 1 && cost <= MaxCost; inRange == outOfRange {
			return fmt.Errorf("cost %d with expect %s", cost, e)
		}
		if got := b.TryAcquireN(cost); got != want {
			r.t.Errorf("%s: TryAcquireN(%s, %d) = %v, expected %v", where, b.name, cost, got, want)
		}
	case "record_success":
		b, err := r.handle(raw)
		if err != nil {
			return err
		}
		b.RecordSuccess()
	case "record_request":
		b, err := r.handle(raw)
		if err != nil {
			return err
		}
		b.RecordRequest()
	case "refund":
		b, err := r.handle(raw)
		if err != nil {
			return err
		}
		cost, err := stepCost(step)
		if err != nil {
			return err
		}
		outOfRange := false
		if e, ok := step["expect"]; ok {
			// Go's RefundN returns nothing; a boolean is checked to be one only.
			if _, outOfRange, err = stepExpect(e); err != nil {
				return err
			}
		}
		if inRange := cost >= 1 && cost <= MaxCost; inRange == outOfRange {
			return fmt.Errorf("refund of cost %d with expect %s", cost, step["expect"])
		}
		b.RefundN(cost)
	case "run":
		return r.run(where, raw)
	case "shutdown":
		return r.shutdown(where, raw)
	case "expect_tenant":
		return r.expectTenants(where, raw)
	}
	if r.t.Failed() {
		r.t.FailNow()
	}
	return nil
}

func (r *scenarioRunner) name(raw json.RawMessage) (string, error) {
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return "", fmt.Errorf("tenant name: %v", err)
	}
	return name, nil
}

func (r *scenarioRunner) handle(raw json.RawMessage) (*TenantBudget, error) {
	name, err := r.name(raw)
	if err != nil {
		return nil, err
	}
	b, ok := r.tenants[name]
	if !ok {
		return nil, fmt.Errorf("tenant %q is used before its \"tenant\" step", name)
	}
	return b, nil
}

func (r *scenarioRunner) reportProblems(problems []string) {
	for _, p := range problems {
		r.t.Error(p)
	}
	if len(problems) > 0 {
		r.t.FailNow()
	}
}

func (r *scenarioRunner) run(where string, raw json.RawMessage) error {
	var run scenarioRun
	if err := strictUnmarshal(raw, &run); err != nil {
		return fmt.Errorf("run: %v", err)
	}
	if run.Attempts == nil {
		return errors.New("run without attempts")
	}
	if err := parseAttempts(*run.Attempts, r.instance, r.redirects); err != nil {
		return err
	}
	r.transport.begin(where, *run.Attempts)
	next := r.client.refresher.runOnce()
	problems := r.transport.end()
	if len(run.NextWakeMs) > 0 {
		if string(run.NextWakeMs) == "null" {
			if next.Before(farFuture) {
				problems = append(problems, fmt.Sprintf("%s: next wake at %v ms, expected never",
					where, durationToMs(next.Sub(conformanceEpoch))))
			}
		} else {
			var want float64
			if err := json.Unmarshal(run.NextWakeMs, &want); err != nil {
				return fmt.Errorf("next_wake_ms: %v", err)
			}
			if !next.Before(farFuture) {
				problems = append(problems, fmt.Sprintf("%s: next wake never, expected at %v ms", where, want))
			} else if got := durationToMs(next.Sub(conformanceEpoch)); math.Abs(got-want) > 0.001 {
				problems = append(problems, fmt.Sprintf("%s: next wake at %v ms, expected at %v ms",
					where, got, want))
			}
		}
	}
	r.reportProblems(problems)
	return nil
}

func (r *scenarioRunner) shutdown(where string, raw json.RawMessage) error {
	var sd scenarioShutdown
	if err := strictUnmarshal(raw, &sd); err != nil {
		return fmt.Errorf("shutdown: %v", err)
	}
	if sd.Attempts == nil {
		return errors.New("shutdown without attempts")
	}
	if err := parseAttempts(*sd.Attempts, r.instance, r.redirects); err != nil {
		return err
	}
	r.transport.begin(where, *sd.Attempts)
	err := r.client.Close()
	problems := r.transport.end()
	if sd.ExpectStatus != nil {
		if got := statusName(err); got != *sd.ExpectStatus {
			problems = append(problems, fmt.Sprintf("%s: Close returned %s (%v), expected %s", where,
				got, err, *sd.ExpectStatus))
		}
	}
	r.reportProblems(problems)
	return nil
}

// statusName is the code name of a Sync error ("OK" for nil); the refresher's errors start
// with it (syncError).
func statusName(err error) string {
	if err == nil {
		return "OK"
	}
	var te *TenantError
	if errors.As(err, &te) {
		return codeName(te.Code)
	}
	name, _, _ := strings.Cut(err.Error(), ":")
	return name
}

func (r *scenarioRunner) expectTenants(where string, raw json.RawMessage) error {
	var all map[string]json.RawMessage
	if err := strictUnmarshal(raw, &all); err != nil {
		return fmt.Errorf("expect_tenant: %v", err)
	}
	if len(all) == 0 {
		return errors.New("expect_tenant names no tenant")
	}
	names := make([]string, 0, len(all))
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names)
	var problems []string
	for _, name := range names {
		var e tenantExpectation
		if err := strictUnmarshal(all[name], &e); err != nil {
			return fmt.Errorf("expect_tenant %q: %v", name, err)
		}
		b, ok := r.tenants[name]
		if !ok {
			return fmt.Errorf("expect_tenant: tenant %q is used before its \"tenant\" step", name)
		}
		s := b.Stats()
		mode := modeNames[b.internalMode()]
		check := func(field string, want *uint64, got uint64) {
			if want != nil && *want != got {
				problems = append(problems, fmt.Sprintf("%s: tenant %q %s = %d, expected %d", where,
					name, field, got, *want))
			}
		}
		if e.Mode != nil && *e.Mode != mode {
			problems = append(problems, fmt.Sprintf("%s: tenant %q mode = %s, expected %s", where,
				name, mode, *e.Mode))
		}
		if e.TokensHeld != nil && *e.TokensHeld != s.TokensHeld {
			problems = append(problems, fmt.Sprintf("%s: tenant %q tokens_held = %d, expected %d",
				where, name, s.TokensHeld, *e.TokensHeld))
		}
		check("retries_allowed", e.RetriesAllowed, s.RetriesAllowed)
		check("retries_denied", e.RetriesDenied, s.RetriesDenied)
		check("shadow_denied", e.ShadowDenied, s.ShadowDenied)
		check("requests", e.Requests, s.Requests)
		check("requests_credited_locally", e.RequestsCreditedLocally, s.RequestsCreditedLocally)
		if e.Shadow != nil && *e.Shadow != s.Shadow {
			problems = append(problems, fmt.Sprintf("%s: tenant %q shadow = %v, expected %v", where,
				name, s.Shadow, *e.Shadow))
		}
		check("fallback_allowed", e.FallbackAllowed, s.FallbackAllowed)
		check("successes", e.Successes, s.Successes)
		check("successes_credited_locally", e.SuccessesCreditedLocally, s.SuccessesCreditedLocally)
		check("tokens_received", e.TokensReceived, s.TokensReceived)
		check("tokens_returned", e.TokensReturned, s.TokensReturned)
		check("refunds", e.Refunds, s.Refunds)
		if e.Error != nil {
			if got := statusName(s.Err); got != *e.Error {
				problems = append(problems, fmt.Sprintf("%s: tenant %q error = %s (%v), expected %s",
					where, name, got, s.Err, *e.Error))
			}
		}
	}
	r.reportProblems(problems)
	return nil
}
