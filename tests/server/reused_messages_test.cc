// ReusedMessages (server/reused_messages.h): a thread's Sync request and response are reused
// from one lease to the next, start every lease empty, are never shared by two leases alive at
// once (on one thread or on two), and are dropped after a request larger than the limit.
#include "server/reused_messages.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "retrybudget/v1/budget.pb.h"

namespace retrybudget {
namespace {

using Messages = ReusedMessages<v1::SyncRequest, v1::SyncResponse>;

// Fills both messages with what a Sync of `tenants` entries leaves behind, unknown fields too.
void Fill(Messages& m, int tenants) {
  m.request()->set_instance_id("instance-with-an-id-longer-than-sso");
  m.request()->set_seq(7);
  for (int i = 0; i < tenants; ++i) {
    v1::TenantSync* t = m.request()->add_tenants();
    t->set_tenant("service-" + std::to_string(i) + ".prod");
    t->set_want(5);
    m.response()->add_tenants()->set_tenant(t->tenant());
  }
  m.request()->GetReflection()->MutableUnknownFields(m.request())->AddVarint(999, 1);
}

void ExpectEmpty(Messages& m) {
  EXPECT_EQ(m.request()->ByteSizeLong(), 0u) << m.request()->ShortDebugString();
  EXPECT_EQ(m.response()->ByteSizeLong(), 0u) << m.response()->ShortDebugString();
}

TEST(ReusedMessagesTest, TheNextLeaseOnAThreadGetsTheSameMessagesEmpty) {
  const v1::SyncRequest* first = nullptr;
  {
    Messages m(100);
    EXPECT_TRUE(m.reused_thread_slot());
    first = m.request();
    Fill(m, 8);
  }
  Messages m(100);
  EXPECT_TRUE(m.reused_thread_slot());
  EXPECT_EQ(m.request(), first);  // reused, so nothing is allocated again
  ExpectEmpty(m);
  // Parsing into it gives exactly the new request, nothing of the old one.
  v1::SyncRequest sent;
  sent.set_instance_id("b");
  sent.set_seq(1);
  sent.add_tenants()->set_tenant("t");
  ASSERT_TRUE(m.request()->ParseFromString(sent.SerializeAsString()));
  EXPECT_EQ(m.request()->SerializeAsString(), sent.SerializeAsString());
}

TEST(ReusedMessagesTest, ALeaseTakenWhileAnotherIsAliveGetsMessagesOfItsOwn) {
  Messages outer(100);
  Fill(outer, 2);
  const std::string outer_bytes = outer.request()->SerializeAsString();
  {
    Messages inner(100);
    EXPECT_FALSE(inner.reused_thread_slot());
    EXPECT_NE(inner.request(), outer.request());
    EXPECT_NE(inner.response(), outer.response());
    ExpectEmpty(inner);
    Fill(inner, 3);
  }
  // The inner lease neither cleared nor changed the outer one's messages.
  EXPECT_EQ(outer.request()->SerializeAsString(), outer_bytes);
  EXPECT_EQ(outer.response()->tenants_size(), 2);
}

TEST(ReusedMessagesTest, EachThreadHasItsOwn) {
  Messages here(100);
  Fill(here, 1);
  const v1::SyncRequest* mine = here.request();
  const v1::SyncRequest* theirs = nullptr;
  std::thread([&] {
    Messages there(100);
    EXPECT_TRUE(there.reused_thread_slot());
    theirs = there.request();
    ExpectEmpty(there);
    Fill(there, 4);
  }).join();
  EXPECT_NE(theirs, mine);
  EXPECT_EQ(here.request()->tenants_size(), 1);
}

TEST(ReusedMessagesTest, ALargeRequestsMessagesAreDroppedAfterIt) {
  { Messages warm(100); }  // the thread has its messages
  {
    Messages big(Messages::kKeepRequestBytes + 1);
    EXPECT_TRUE(big.reused_thread_slot());  // used once more...
    Fill(big, 1000);
  }
  Messages next(100);  // ...and not kept: the next lease starts from new, empty messages
  EXPECT_TRUE(next.reused_thread_slot());
  ExpectEmpty(next);
  EXPECT_EQ(next.request()->tenants().Capacity(), 0) << "the 1,000 entries' storage was kept";
}

TEST(ReusedMessagesTest, ALargeRequestOnAThreadWithoutMessagesKeepsNone) {
  std::thread([] {
    {
      Messages big(Messages::kKeepRequestBytes + 1);
      EXPECT_FALSE(big.reused_thread_slot());
      Fill(big, 10);
    }
    Messages next(100);
    EXPECT_TRUE(next.reused_thread_slot());
    ExpectEmpty(next);
    EXPECT_EQ(next.request()->tenants().Capacity(), 0);
  }).join();
}

}  // namespace
}  // namespace retrybudget
