// Request bytes parsed by the service itself, for every RPC of both services (they are all
// registered as raw methods): bytes that do not parse as the request message get
// INVALID_ARGUMENT naming the field at fault, never gRPC's bare UNIMPLEMENTED with an empty
// message, and nothing is applied.
#ifndef RETRYBUDGET_SERVER_REQUEST_PARSING_H_
#define RETRYBUDGET_SERVER_REQUEST_PARSING_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace retrybudget {

// Parses `bytes` into `request` (which may live on an arena). On failure: INVALID_ARGUMENT
// "request is not a valid <full message name>: <why>", where <why> names the first field that
// is wrong, by its path ("instance_id", "tenants[0].tenant", "tenant", "policy"): a field of the
// wrong wire type, a nested message that is not an encoding, a string that is not UTF-8, an
// instance id or tenant name that breaks the names' rules (retrybudget/names.h); else "the
// bytes are not a protobuf encoding" or "the encoding does not parse". `request` is then
// unspecified. Thread-compatible; the diagnosis runs only on a failed parse.
absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* request);

// Serialises `response` into `bytes` (INTERNAL naming the message when it cannot).
absl::Status SerializeResponse(const google::protobuf::Message& response, grpc::ByteBuffer* bytes);

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_REQUEST_PARSING_H_
