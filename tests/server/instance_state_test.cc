// The records an instance keeps per tenant (InstanceTenants): the first inline, the others in a
// map, against a plain std::map as the model.
#include "server/instance_state.h"

#include <map>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace retrybudget::core_internal {
namespace {

std::map<std::string, uint64_t> Contents(const InstanceTenants& records) {
  std::map<std::string, uint64_t> out;
  records.ForEach([&out](const std::string& tenant, const InstanceTenant& rec) {
    EXPECT_TRUE(out.emplace(tenant, rec.ledger.outstanding).second) << tenant << " twice";
  });
  return out;
}

TEST(InstanceTenantsTest, FirstRecordInlineOthersBesideIt) {
  InstanceTenants records;
  EXPECT_EQ(records.Find("a"), nullptr);
  EXPECT_EQ(records.size(), 0u);

  auto [a, made_a] = records.FindOrAdd("a");
  ASSERT_TRUE(made_a);
  a->ledger.outstanding = 1;
  auto [b, made_b] = records.FindOrAdd("b");
  ASSERT_TRUE(made_b);
  b->ledger.outstanding = 2;

  auto [again, made_again] = records.FindOrAdd("a");
  EXPECT_FALSE(made_again);
  EXPECT_EQ(again->ledger.outstanding, 1u);
  EXPECT_EQ(records.Find("b")->ledger.outstanding, 2u);
  EXPECT_EQ(records.Find("c"), nullptr);
  EXPECT_EQ(records.size(), 2u);
  EXPECT_EQ(Contents(records), (std::map<std::string, uint64_t>{{"a", 1}, {"b", 2}}));
}

// A new record is empty, also in the inline place a dropped record left.
TEST(InstanceTenantsTest, ErasingTheInlineRecordMovesAnotherIntoItsPlace) {
  InstanceTenants records;
  const std::string long_name(100, 'x');  // on the heap, not in the string's own buffer
  records.FindOrAdd("a").first->ledger.outstanding = 1;
  records.FindOrAdd(long_name).first->ledger.outstanding = 7;

  records.Erase("a");
  EXPECT_EQ(records.Find("a"), nullptr);
  ASSERT_NE(records.Find(long_name), nullptr);
  EXPECT_EQ(records.Find(long_name)->ledger.outstanding, 7u);
  EXPECT_EQ(records.size(), 1u);

  records.Erase(long_name);
  EXPECT_EQ(records.size(), 0u);
  EXPECT_EQ(records.Find(long_name), nullptr);
  auto [fresh, made] = records.FindOrAdd("a");
  EXPECT_TRUE(made);
  EXPECT_EQ(fresh->ledger.outstanding, 0u);
  EXPECT_EQ(fresh->tenant, nullptr);
  records.Erase("absent");  // no record: nothing changes
  EXPECT_EQ(records.size(), 1u);
}

TEST(InstanceTenantsTest, AgreesWithAMapThroughRandomAddsAndErases) {
  std::mt19937 rng(20);
  InstanceTenants records;
  std::map<std::string, uint64_t> model;
  for (int step = 0; step < 20000; ++step) {
    const std::string tenant = "tenant-" + std::to_string(rng() % 64);
    switch (rng() % 3) {
      case 0: {
        auto [rec, made] = records.FindOrAdd(tenant);
        EXPECT_EQ(made, !model.contains(tenant)) << tenant;
        rec->ledger.outstanding = step;
        model[tenant] = step;
        break;
      }
      case 1:
        records.Erase(tenant);
        model.erase(tenant);
        break;
      default: {
        const InstanceTenant* rec = records.Find(tenant);
        ASSERT_EQ(rec != nullptr, model.contains(tenant)) << tenant;
        if (rec != nullptr) {
          EXPECT_EQ(rec->ledger.outstanding, model[tenant]);
        }
      }
    }
    ASSERT_EQ(records.size(), model.size());
  }
  EXPECT_EQ(Contents(records), model);
}

}  // namespace
}  // namespace retrybudget::core_internal
