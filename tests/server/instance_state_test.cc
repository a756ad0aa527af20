// An instance's record (Instance::Create, its id in the same allocation) and the records it
// keeps per tenant (InstanceTenants): the first inline and known by its budget's name, the
// others in a map, against a plain std::map as the model.
#include "server/instance_state.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace retrybudget::core_internal {
namespace {

class InstanceTenantsTest : public ::testing::Test {
 protected:
  RefPtr<Tenant> Budget(const std::string& name) {
    return MakeRef<Tenant>(name, policies_.Intern(ResolvedPolicy{}), v1::POLICY_SOURCE_DEFAULT,
                           absl::UnixEpoch());
  }

  static std::map<std::string, uint64_t> Contents(const InstanceTenants& records) {
    std::map<std::string, uint64_t> out;
    records.ForEach([&out](const std::string& tenant, const InstanceTenant& rec) {
      EXPECT_EQ(rec.tenant->name, tenant);
      EXPECT_TRUE(out.emplace(tenant, rec.ledger.outstanding).second) << tenant << " twice";
    });
    return out;
  }

  PolicyTable policies_;
};

TEST_F(InstanceTenantsTest, FirstRecordInlineOthersBesideIt) {
  InstanceTenants records;
  EXPECT_EQ(records.Find("a"), nullptr);
  EXPECT_EQ(records.size(), 0u);

  RefPtr<Tenant> a = Budget("a");
  InstanceTenant* rec_a = records.Add(a);
  EXPECT_TRUE(rec_a->tenant == a);
  rec_a->ledger.outstanding = 1;
  records.Add(Budget("b"))->ledger.outstanding = 2;

  EXPECT_EQ(records.Find("a")->ledger.outstanding, 1u);
  EXPECT_EQ(records.Find("b")->ledger.outstanding, 2u);
  EXPECT_EQ(records.Find("b")->tenant->name, "b");
  EXPECT_EQ(records.Find("c"), nullptr);
  EXPECT_EQ(records.size(), 2u);
  EXPECT_EQ(Contents(records), (std::map<std::string, uint64_t>{{"a", 1}, {"b", 2}}));
}

// A new record is empty, also in the inline place a dropped record left.
TEST_F(InstanceTenantsTest, ErasingTheInlineRecordMovesAnotherIntoItsPlace) {
  InstanceTenants records;
  const std::string long_name(100, 'x');  // on the heap, not in the string's own buffer
  records.Add(Budget("a"))->ledger.outstanding = 1;
  records.Add(Budget(long_name))->ledger.outstanding = 7;

  records.Erase("a");
  EXPECT_EQ(records.Find("a"), nullptr);
  ASSERT_NE(records.Find(long_name), nullptr);
  EXPECT_EQ(records.Find(long_name)->ledger.outstanding, 7u);
  EXPECT_EQ(records.size(), 1u);

  records.Erase(long_name);
  EXPECT_EQ(records.size(), 0u);
  EXPECT_EQ(records.Find(long_name), nullptr);
  RefPtr<Tenant> again = Budget("a");
  InstanceTenant* fresh = records.Add(again);
  EXPECT_EQ(fresh->ledger.outstanding, 0u);
  EXPECT_TRUE(fresh->tenant == again);
  records.Erase("absent");  // no record: nothing changes
  EXPECT_EQ(records.size(), 1u);
}

TEST_F(InstanceTenantsTest, AgreesWithAMapThroughRandomAddsAndErases) {
  std::mt19937 rng(20);
  InstanceTenants records;
  std::map<std::string, uint64_t> model;
  for (int step = 0; step < 20000; ++step) {
    const std::string tenant = "tenant-" + std::to_string(rng() % 64);
    switch (rng() % 3) {
      case 0: {
        InstanceTenant* rec = records.Find(tenant);
        ASSERT_EQ(rec == nullptr, !model.contains(tenant)) << tenant;
        if (rec == nullptr) rec = records.Add(Budget(tenant));
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

// The records after the first are found by their budget's name, read through the record (no
// copy of it). A record whose budget is replaced by a new one of the same name, the old one
// then freed (as BudgetCore::ApplyEntry does after a budget was deleted and made again), is
// still found, and so is every other record after the set grows and moves them; under
// AddressSanitizer a lookup that read the freed budget's name would be reported.
TEST_F(InstanceTenantsTest, ARecordsBudgetReplacedByOneOfTheSameNameIsStillFound) {
  InstanceTenants records;
  records.Add(Budget("first"));
  const std::string name(40, 'r');  // a name on the heap, freed with its budget
  {
    RefPtr<Tenant> old_budget = Budget(name);
    InstanceTenant* rec = records.Add(old_budget);
    rec->ledger.outstanding = 5;
    RefPtr<Tenant> new_budget = Budget(name);
    rec->tenant = new_budget;  // the last references to the old budget go at the block's end
  }
  for (int i = 0; i < 100; ++i) records.Add(Budget("other-" + std::to_string(i)));  // rehashes
  InstanceTenant* rec = records.Find(name);
  ASSERT_NE(rec, nullptr);
  EXPECT_EQ(rec->ledger.outstanding, 5u);
  EXPECT_EQ(rec->tenant->name, name);
  EXPECT_EQ(records.size(), 102u);
  records.Erase(name);
  EXPECT_EQ(records.Find(name), nullptr);
  for (int i = 0; i < 100; ++i) {
    ASSERT_NE(records.Find("other-" + std::to_string(i)), nullptr) << i;
  }
}

// Create copies the id into the record's own allocation (under AddressSanitizer, a byte read
// or written past it is reported).
TEST(InstanceTest, CreateKeepsTheIdInTheRecord) {
  std::vector<RefPtr<Instance>> made;
  for (size_t length : {1, 15, 16, 35, 128, 1024}) {
    std::string id(length, 'i');
    id.back() = 'z';
    RefPtr<Instance> instance = Instance::Create(id, /*principal_hash=*/length);
    id.assign(length, '-');  // the record holds a copy, not the caller's characters
    EXPECT_EQ(instance->id().size(), length);
    EXPECT_EQ(instance->id().back(), 'z');
    EXPECT_EQ(instance->id().find('-'), absl::string_view::npos);
    EXPECT_EQ(instance->principal, length);
    made.push_back(std::move(instance));
  }
  made.clear();  // each freed the way it was allocated
}

}  // namespace
}  // namespace retrybudget::core_internal
