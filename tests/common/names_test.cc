// The tenant-name rule of retrybudget/names.h, character by character: IsValidTenantName and
// ValidateTenantName accept exactly [A-Za-z0-9._:/-], for every one of the 256 byte values.
#include "retrybudget/names.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace retrybudget {
namespace {

TEST(TenantNameTest, EveryByteValueIsAcceptedExactlyWhenItIsInTheAllowedSet) {
  const std::string allowed =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/-";
  for (int c = 0; c < 256; ++c) {
    const std::string name = std::string("a") + static_cast<char>(c) + "z";
    const bool expected = allowed.find(static_cast<char>(c)) != std::string::npos;
    EXPECT_EQ(IsValidTenantName(name), expected) << "byte " << c;
    const absl::Status status = ValidateTenantName(name, "tenant");
    EXPECT_EQ(status.ok(), expected) << "byte " << c << ": " << status;
    if (!expected) {
      EXPECT_TRUE(absl::StrContains(status.message(), "at position 1")) << status;
    }
  }
}

TEST(TenantNameTest, LengthLimits) {
  EXPECT_FALSE(IsValidTenantName(""));
  EXPECT_TRUE(IsValidTenantName(std::string(kMaxTenantNameLength, 'x')));
  EXPECT_FALSE(IsValidTenantName(std::string(kMaxTenantNameLength + 1, 'x')));
}

}  // namespace
}  // namespace retrybudget
