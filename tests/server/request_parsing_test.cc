// The Sync's own parse and serialisation (server/request_parsing.h): a request arrives in one
// slice or in several (parsed through a reader then), and either way parses to the same message
// or fails with the field at fault; a response is written into one slice of its size.
#include "server/request_parsing.h"

#include <string>
#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget {
namespace {

// `bytes` cut into slices of at most `piece` bytes (0: one slice).
grpc::ByteBuffer Buffer(const std::string& bytes, size_t piece = 0) {
  std::vector<grpc::Slice> slices;
  if (piece == 0) piece = bytes.size() + 1;
  for (size_t at = 0; at < bytes.size(); at += piece) {
    slices.emplace_back(bytes.substr(at, piece));
  }
  if (slices.empty()) slices.emplace_back(std::string());
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::SyncRequest Request(int tenants) {
  v1::SyncRequest r;
  r.set_instance_id("host-7/worker-3/5f0c6a1e9b2d4c8f");
  r.set_seq(41);
  for (int i = 0; i < tenants; ++i) {
    v1::TenantSync* t = r.add_tenants();
    t->set_tenant("service-" + std::to_string(i) + ".prod");
    t->set_want(64);
    t->set_successes(1000 + i);
    t->set_retries_spent(7);
    t->set_tokens_received(64);
  }
  return r;
}

TEST(ParseRequestTest, OneSliceOrManyParseToTheSameRequest) {
  const std::string bytes = Request(8).SerializeAsString();
  for (size_t piece : {size_t{0}, size_t{1}, size_t{7}, size_t{64}}) {
    v1::SyncRequest parsed;
    ASSERT_TRUE(ParseRequest(Buffer(bytes, piece), &parsed).ok()) << "pieces of " << piece;
    EXPECT_EQ(parsed.SerializeAsString(), bytes) << "pieces of " << piece;
  }
}

TEST(ParseRequestTest, AnEmptyRequestParsesEmpty) {
  v1::SyncRequest parsed;
  parsed.set_seq(3);  // a message parsed into is replaced, not merged into
  ASSERT_TRUE(ParseRequest(Buffer(""), &parsed).ok());
  EXPECT_EQ(parsed.ByteSizeLong(), 0u);
}

TEST(ParseRequestTest, BytesThatDoNotParseNameTheFieldAtFaultWhateverTheSlices) {
  // tenants[1].tenant with a byte an encoding allows and a tenant name does not.
  v1::SyncRequest bad = Request(2);
  bad.mutable_tenants(1)->set_tenant(std::string("a\xff", 2));
  std::string bytes;
  ASSERT_TRUE(bad.SerializePartialToString(&bytes));
  for (size_t piece : {size_t{0}, size_t{5}}) {
    v1::SyncRequest parsed;
    const absl::Status s = ParseRequest(Buffer(bytes, piece), &parsed);
    ASSERT_FALSE(s.ok()) << "pieces of " << piece;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("tenants[1].tenant"), absl::string_view::npos) << s.message();
  }
  // Not a protobuf encoding at all (a truncated length-delimited field).
  v1::SyncRequest parsed;
  const absl::Status s = ParseRequest(Buffer(std::string("\x0a\x7f", 2)), &parsed);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("retrybudget.v1.SyncRequest"), absl::string_view::npos)
      << s.message();
}

TEST(SerializeResponseTest, WritesOneSliceThatParsesBackToTheResponse) {
  for (int tenants : {0, 1, 8, 2000}) {
    v1::SyncResponse response;
    for (int i = 0; i < tenants; ++i) {
      v1::TenantGrant* g = response.add_tenants();
      g->set_tenant("service-" + std::to_string(i) + ".prod");
      g->set_granted(static_cast<uint64_t>(i));
      g->mutable_safe_share()->set_capacity(0.25 * i);
      g->set_capacity(100);
    }
    grpc::ByteBuffer bytes = Buffer("stale bytes the response replaces");
    ASSERT_TRUE(SerializeResponse(response, &bytes).ok());
    EXPECT_EQ(bytes.Length(), response.ByteSizeLong());
    grpc::Slice slice;
    ASSERT_TRUE(bytes.TrySingleSlice(&slice).ok()) << tenants << " tenants";
    v1::SyncResponse back;
    ASSERT_TRUE(back.ParseFromArray(slice.begin(), static_cast<int>(slice.size())));
    EXPECT_EQ(back.SerializeAsString(), response.SerializeAsString()) << tenants << " tenants";
  }
}

}  // namespace
}  // namespace retrybudget
