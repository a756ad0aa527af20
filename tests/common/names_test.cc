// The name rules of retrybudget/names.h, character by character, for every one of the 256 byte
// values: IsValidTenantName and ValidateTenantName accept exactly [A-Za-z0-9._:/-];
// IsValidInstanceId and ValidateInstanceId exactly printable ASCII (0x21-0x7e).
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

TEST(InstanceIdTest, EveryByteValueIsAcceptedExactlyWhenItIsPrintableAscii) {
  for (int c = 0; c < 256; ++c) {
    const std::string id = std::string("a") + static_cast<char>(c) + "z";
    const bool expected = c >= 0x21 && c <= 0x7e;
    EXPECT_EQ(IsValidInstanceId(id), expected) << "byte " << c;
    const absl::Status status = ValidateInstanceId(id, "instance_id");
    EXPECT_EQ(status.ok(), expected) << "byte " << c << ": " << status;
    if (!expected) {
      EXPECT_TRUE(absl::StrContains(status.message(), "at position 1")) << status;
    }
  }
}

TEST(InstanceIdTest, LengthLimits) {
  EXPECT_FALSE(IsValidInstanceId(""));
  EXPECT_FALSE(ValidateInstanceId("").ok());
  EXPECT_TRUE(IsValidInstanceId(std::string(kMaxInstanceIdLength, 'x')));
  EXPECT_TRUE(ValidateInstanceId(std::string(kMaxInstanceIdLength, 'x')).ok());
  EXPECT_FALSE(IsValidInstanceId(std::string(kMaxInstanceIdLength + 1, 'x')));
  EXPECT_FALSE(ValidateInstanceId(std::string(kMaxInstanceIdLength + 1, 'x')).ok());
}

}  // namespace
}  // namespace retrybudget
