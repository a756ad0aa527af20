package retrybudget

import (
	"testing"

	pb "github.com/retry-budget/retry-budget/client/go/budgetpb"
)

// legacyTenantSync is a message of the older protobuf Go API (github.com/golang/protobuf's
// generated code: struct tags, Reset, String, ProtoMessage) with TenantSync's first two fields.
type legacyTenantSync struct {
	Tenant    string `protobuf:"bytes,1,opt,name=tenant,proto3" json:"tenant,omitempty"`
	Successes uint64 `protobuf:"varint,2,opt,name=successes,proto3" json:"successes,omitempty"`
}

func (m *legacyTenantSync) Reset()         { *m = legacyTenantSync{} }
func (m *legacyTenantSync) String() string { return m.Tenant }
func (*legacyTenantSync) ProtoMessage()    {}

// The codec encodes messages of both APIs with google.golang.org/protobuf alone, to the same
// bytes, and refuses what is not a message.
func TestCodecEncodesMessagesOfBothProtobufAPIs(t *testing.T) {
	var c protoCodec
	data, err := c.Marshal(&legacyTenantSync{Tenant: "t1", Successes: 7})
	if err != nil {
		t.Fatal(err)
	}
	var current pb.TenantSync
	if err := c.Unmarshal(data, &current); err != nil || current.Tenant != "t1" || current.Successes != 7 {
		t.Fatalf("a legacy message read as the current one: %v, %v", &current, err)
	}
	data, err = c.Marshal(&pb.TenantSync{Tenant: "t2", Successes: 9})
	if err != nil {
		t.Fatal(err)
	}
	var legacy legacyTenantSync
	if err := c.Unmarshal(data, &legacy); err != nil || legacy.Tenant != "t2" || legacy.Successes != 9 {
		t.Fatalf("the current message read as a legacy one: %+v, %v", legacy, err)
	}
	if _, err := c.Marshal(struct{}{}); err == nil {
		t.Fatal("a non-message was encoded")
	}
	if err := c.Unmarshal(data, &struct{}{}); err == nil {
		t.Fatal("a non-message was decoded into")
	}
}
