#include "retrybudget/owner_redirect.h"

#include "absl/strings/cord.h"

namespace retrybudget {

absl::Status WithOwnerAddress(absl::Status status, absl::string_view owner) {
  if (status.ok() || owner.empty()) return status;
  status.SetPayload(kOwnerPayloadTypeUrl, absl::Cord(owner));
  return status;
}

std::optional<std::string> OwnerAddressOf(const absl::Status& status) {
  auto payload = status.GetPayload(kOwnerPayloadTypeUrl);
  if (!payload.has_value() || payload->empty()) return std::nullopt;
  return std::string(*payload);
}

}  // namespace retrybudget
