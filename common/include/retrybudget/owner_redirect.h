// Where an admin call about one tenant must go in cluster mode (DESIGN.md "Many servers"): a
// server that does not own the tenant's shard answers FAILED_PRECONDITION and names the owner's
// advertise address in the trailing metadata `retry-budget-owner: HOST:PORT`. Inside the server
// the address travels on the absl::Status as a payload until the service layer turns it into
// that metadata.
//
//   absl::Status s = WithOwnerAddress(absl::FailedPreconditionError("..."), "127.0.0.1:7002");
//   std::optional<std::string> owner = OwnerAddressOf(s);  // "127.0.0.1:7002"
#ifndef RETRYBUDGET_COMMON_OWNER_REDIRECT_H_
#define RETRYBUDGET_COMMON_OWNER_REDIRECT_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace retrybudget {

// The trailing metadata key (gRPC keys are lower case) that holds the owner's HOST:PORT.
inline constexpr absl::string_view kOwnerMetadataKey = "retry-budget-owner";
// The type URL of the absl::Status payload that holds it inside the server.
inline constexpr absl::string_view kOwnerPayloadTypeUrl =
    "type.googleapis.com/retrybudget.v1.OwnerAddress";

// `status` with the owner's address attached (unchanged when `status` is OK or `owner` empty).
absl::Status WithOwnerAddress(absl::Status status, absl::string_view owner);
// The owner's address attached to `status`, nullopt for none.
std::optional<std::string> OwnerAddressOf(const absl::Status& status);

}  // namespace retrybudget

#endif  // RETRYBUDGET_COMMON_OWNER_REDIRECT_H_
