// RefPtr, the intrusive count the core's tenants and instances are shared by: a record lives
// exactly as long as its last reference.
#include "server/ref_ptr.h"

#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace retrybudget {
namespace {

struct Counted final : RefCounted {
  explicit Counted(int* deletions) : deletions(deletions) {}
  ~Counted() { ++*deletions; }
  int* deletions;
  int value = 0;
};

TEST(RefPtrTest, TheRecordGoesWithItsLastReference) {
  int deletions = 0;
  {
    RefPtr<Counted> a = MakeRef<Counted>(&deletions);
    a->value = 7;
    {
      RefPtr<Counted> b = a;  // copy
      EXPECT_EQ(b.get(), a.get());
      EXPECT_TRUE(b == a);
      RefPtr<Counted> c = std::move(b);  // move: b lets go, c holds
      EXPECT_TRUE(b == nullptr);
      EXPECT_EQ((*c).value, 7);
    }
    EXPECT_EQ(deletions, 0);
    EXPECT_EQ(a->value, 7);
  }
  EXPECT_EQ(deletions, 1);
}

TEST(RefPtrTest, AssignmentResetAndSelfAssignment) {
  int first = 0;
  int second = 0;
  RefPtr<Counted> a = MakeRef<Counted>(&first);
  RefPtr<Counted> b = MakeRef<Counted>(&second);
  a = a;  // NOLINT: self-assignment keeps the record
  EXPECT_EQ(first, 0);
  a = b;  // a's first record had no other reference
  EXPECT_EQ(first, 1);
  EXPECT_TRUE(a == b);
  b.reset();
  EXPECT_FALSE(static_cast<bool>(b));
  EXPECT_EQ(second, 0);  // a still holds it
  a = std::move(a);  // NOLINT: self-move leaves it held
  EXPECT_EQ(second, 0);
  a = nullptr;
  EXPECT_EQ(second, 1);
  RefPtr<Counted> none;
  EXPECT_TRUE(none == nullptr);
  none.reset();  // nothing to let go
}

TEST(RefPtrTest, AContainerOfReferencesKeepsEachRecordOnce) {
  int deletions = 0;
  RefPtr<Counted> kept = MakeRef<Counted>(&deletions);
  {
    std::vector<RefPtr<Counted>> many(1000, kept);
    many.resize(10);
    many.push_back(MakeRef<Counted>(&deletions));
  }
  EXPECT_EQ(deletions, 1);  // the pushed one; `kept` lives
  kept.reset();
  EXPECT_EQ(deletions, 2);
}

// PolicyTable drops an interned policy when its own reference is the only one left.
TEST(RefPtrTest, TellsWhenItIsTheOnlyReference) {
  int deletions = 0;
  RefPtr<const Counted> a = MakeRef<const Counted>(&deletions);  // shared read-only
  EXPECT_TRUE(a.IsOnlyReference());
  RefPtr<const Counted> b = a;
  EXPECT_FALSE(a.IsOnlyReference());
  EXPECT_FALSE(b.IsOnlyReference());
  b.reset();
  EXPECT_TRUE(a.IsOnlyReference());
  EXPECT_FALSE(b.IsOnlyReference());  // null: no record at all
  a.reset();
  EXPECT_EQ(deletions, 1);
}

}  // namespace
}  // namespace retrybudget
