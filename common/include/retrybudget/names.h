// Shape rules for names that cross the wire, shared by server and client so both refuse the
// same input with the same message.
#ifndef RETRYBUDGET_NAMES_H_
#define RETRYBUDGET_NAMES_H_

#include <cstddef>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"

namespace retrybudget {

inline constexpr size_t kMaxTenantNameLength = 128;
inline constexpr size_t kMaxInstanceIdLength = 128;

// OK when `tenant` is 1-128 characters of [A-Za-z0-9._:/-]; otherwise INVALID_ARGUMENT whose
// message names `field` and shows the offending value (truncated) or character.
absl::Status ValidateTenantName(absl::string_view tenant, absl::string_view field = "tenant");

// The same rule as a bool, for hot paths that build the error message only when needed.
bool IsValidTenantName(absl::string_view tenant);

// OK when `id` is 1-128 printable ASCII characters (0x21-0x7e); otherwise INVALID_ARGUMENT
// naming `field`.
absl::Status ValidateInstanceId(absl::string_view id, absl::string_view field = "instance_id");

// The same rule as a bool (one comparison per character), for hot paths.
bool IsValidInstanceId(absl::string_view id);

// `value` quoted and cut to at most 40 characters, for error messages.
std::string QuoteForError(absl::string_view value);

}  // namespace retrybudget

#endif  // RETRYBUDGET_NAMES_H_
