#include "server/request_parsing.h"

#include <climits>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "retrybudget/names.h"

namespace retrybudget {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Whether `s` is well-formed UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int extra;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      extra = 1, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      extra = 2, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      extra = 3, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + extra >= s.size()) return false;
    for (int k = 1; k <= extra; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += extra + 1;
  }
  return true;
}

// The wire types a field may arrive with (a repeated scalar may also come packed).
bool WireTypeFits(const FieldDescriptor& field, UnknownField::Type type) {
  switch (field.type()) {
    case FieldDescriptor::TYPE_STRING:
    case FieldDescriptor::TYPE_BYTES:
    case FieldDescriptor::TYPE_MESSAGE:
      return type == UnknownField::TYPE_LENGTH_DELIMITED;
    case FieldDescriptor::TYPE_GROUP:
      return type == UnknownField::TYPE_GROUP;
    default:
      break;
  }
  if (field.is_repeated() && type == UnknownField::TYPE_LENGTH_DELIMITED) return true;
  switch (field.type()) {
    case FieldDescriptor::TYPE_DOUBLE:
    case FieldDescriptor::TYPE_FIXED64:
    case FieldDescriptor::TYPE_SFIXED64:
      return type == UnknownField::TYPE_FIXED64;
    case FieldDescriptor::TYPE_FLOAT:
    case FieldDescriptor::TYPE_FIXED32:
    case FieldDescriptor::TYPE_SFIXED32:
      return type == UnknownField::TYPE_FIXED32;
    default:
      return type == UnknownField::TYPE_VARINT;
  }
}

// A string field's own rules: instance ids and tenant names have theirs (names.h), every other
// string must be UTF-8.
absl::Status CheckString(const FieldDescriptor& field, absl::string_view value,
                         const std::string& path) {
  if (field.name() == "instance_id") return ValidateInstanceId(value, path);
  if (field.name() == "tenant") return ValidateTenantName(value, path);
  if (!IsUtf8(value)) return absl::InvalidArgumentError(absl::StrCat(path, " is not valid UTF-8"));
  return absl::OkStatus();
}

// Why `bytes` are not a `message`: the first field at fault under `prefix` ("" at the top, else
// "tenants[0]."), or OK when no field is.
absl::Status FindFault(const Descriptor& message, absl::string_view bytes,
                       const std::string& prefix) {
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        prefix.empty() ? std::string("the bytes are not a protobuf encoding")
                       : absl::StrCat(prefix.substr(0, prefix.size() - 1),
                                      " is not a protobuf encoding"));
  }
  absl::flat_hash_map<int, int> seen;  // field number -> occurrences so far (the index)
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& f = fields.field(i);
    const FieldDescriptor* field = message.FindFieldByNumber(f.number());
    if (field == nullptr) continue;  // unknown fields are allowed
    std::string path = absl::StrCat(prefix, field->name());
    if (field->is_repeated()) absl::StrAppend(&path, "[", seen[f.number()]++, "]");
    if (!WireTypeFits(*field, f.type())) {
      return absl::InvalidArgumentError(absl::StrCat(path, " has the wrong wire type"));
    }
    if (f.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (absl::Status s = CheckString(*field, f.length_delimited(), path); !s.ok()) return s;
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (absl::Status s = FindFault(*field->message_type(), f.length_delimited(), path + ".");
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseRequest(const grpc::ByteBuffer& bytes, google::protobuf::Message* request) {
  // A request in one uncompressed slice (the usual small one) is parsed from its bytes, without
  // a reader and a stream over them.
  if (grpc::Slice slice; bytes.TrySingleSlice(&slice).ok() && slice.size() <= INT_MAX) {
    if (request->ParseFromArray(slice.begin(), static_cast<int>(slice.size()))) {
      return absl::OkStatus();
    }
  } else {
    grpc::ByteBuffer shared(bytes);  // shares the slices; the reader consumes this copy
    grpc::ProtoBufferReader reader(&shared);
    if (request->ParseFromZeroCopyStream(&reader)) return absl::OkStatus();
  }
  std::vector<grpc::Slice> slices;
  std::string flat;
  if (bytes.Dump(&slices).ok()) {
    for (const grpc::Slice& s : slices) {
      flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
    }
  }
  absl::Status fault = FindFault(*request->GetDescriptor(), flat, "");
  return absl::InvalidArgumentError(
      absl::StrCat("request is not a valid ", request->GetDescriptor()->full_name(), ": ",
                   fault.ok() ? absl::string_view("the encoding does not parse")
                              : fault.message()));
}

absl::Status SerializeResponse(const google::protobuf::Message& response,
                               grpc::ByteBuffer* bytes) {
  // Written in one pass into one slice of the encoding's size. (gRPC's own serialiser does so
  // only up to 23 bytes, and streams anything larger through a ZeroCopyOutputStream.)
  const size_t size = response.ByteSizeLong();
  if (size > INT_MAX) {
    return absl::InternalError(absl::StrCat("could not serialise the ",
                                            response.GetDescriptor()->full_name(), ": ", size,
                                            " bytes is over the 2 GiB a message may take"));
  }
  grpc::Slice slice(size);
  uint8_t* start = const_cast<uint8_t*>(slice.begin());  // this slice's own new bytes
  if (response.SerializeWithCachedSizesToArray(start) != start + size) {
    return absl::InternalError(absl::StrCat("could not serialise the ",
                                            response.GetDescriptor()->full_name(),
                                            ": the message changed while it was written"));
  }
  grpc::ByteBuffer written(&slice, 1);
  bytes->Swap(&written);
  return absl::OkStatus();
}

}  // namespace retrybudget
