// The name rules of retrybudget/names.h, character by character, for every one of the 256 byte
// values: IsValidTenantName and ValidateTenantName accept exactly [A-Za-z0-9._:/-];
// IsValidInstanceId and ValidateInstanceId exactly printable ASCII (0x21-0x7e).
#include "retrybudget/names.h"

#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace retrybudget {
namespace {

// For each of the 256 byte values c: the name "a" c "z" passes `is_valid` and `validate` exactly
// when `allowed(c)`, and a refusal names position 1.
void ExpectEveryByteValue(bool (*is_valid)(absl::string_view),
                          absl::Status (*validate)(absl::string_view, absl::string_view),
                          bool (*allowed)(int)) {
  for (int c = 0; c < 256; ++c) {
    const std::string name = std::string("a") + static_cast<char>(c) + "z";
    const bool expected = allowed(c);
    EXPECT_EQ(is_valid(name), expected) << "byte " << c;
    const absl::Status status = validate(name, "field");
    EXPECT_EQ(status.ok(), expected) << "byte " << c << ": " << status;
    if (!expected) {
      EXPECT_TRUE(absl::StrContains(status.message(), "at position 1")) << status;
    }
  }
}

TEST(TenantNameTest, EveryByteValueIsAcceptedExactlyWhenItIsInTheAllowedSet) {
  ExpectEveryByteValue(&IsValidTenantName, &ValidateTenantName, [](int c) {
    const std::string allowed =
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._:/-";
    return allowed.find(static_cast<char>(c)) != std::string::npos;
  });
}

TEST(TenantNameTest, LengthLimits) {
  EXPECT_FALSE(IsValidTenantName(""));
  EXPECT_TRUE(IsValidTenantName(std::string(kMaxTenantNameLength, 'x')));
  EXPECT_FALSE(IsValidTenantName(std::string(kMaxTenantNameLength + 1, 'x')));
}

TEST(InstanceIdTest, EveryByteValueIsAcceptedExactlyWhenItIsPrintableAscii) {
  ExpectEveryByteValue(&IsValidInstanceId, &ValidateInstanceId,
                       [](int c) { return c >= 0x21 && c <= 0x7e; });
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
