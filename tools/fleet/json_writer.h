// A writer for the one-line JSON objects the fleet tool prints: keys in insertion order, numbers,
// booleans, strings and nested objects. No parser here (fleet_report.cc parses with protobuf's
// JSON support).
//
//   JsonWriter w;
//   w.Number("calls", 12).Bool("within_budget", true);
//   std::string line = w.Finish();  // {"calls":12,"within_budget":true}
#ifndef RETRYBUDGET_TOOLS_FLEET_JSON_WRITER_H_
#define RETRYBUDGET_TOOLS_FLEET_JSON_WRITER_H_

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace retrybudget::fleet {

// Thread-compatible. Builds one JSON object; Finish() closes it.
class JsonWriter {
 public:
  JsonWriter& Number(absl::string_view key, uint64_t value) {
    Key(key);
    absl::StrAppend(&out_, value);
    return *this;
  }
  JsonWriter& Number(absl::string_view key, int64_t value) {
    Key(key);
    absl::StrAppend(&out_, value);
    return *this;
  }
  JsonWriter& Number(absl::string_view key, int value) { return Number(key, int64_t{value}); }
  // Non-finite values (which JSON cannot hold) are written as null.
  JsonWriter& Number(absl::string_view key, double value) {
    Key(key);
    if (std::isfinite(value)) {
      absl::StrAppend(&out_, absl::StrFormat("%.10g", value));
    } else {
      out_ += "null";
    }
    return *this;
  }
  JsonWriter& Counts(absl::string_view key, const std::vector<uint64_t>& values) {
    Key(key);
    out_ += "[";
    for (size_t i = 0; i < values.size(); ++i) {
      if (i > 0) out_ += ",";
      absl::StrAppend(&out_, values[i]);
    }
    out_ += "]";
    return *this;
  }
  JsonWriter& Bool(absl::string_view key, bool value) {
    Key(key);
    out_ += value ? "true" : "false";
    return *this;
  }
  JsonWriter& String(absl::string_view key, absl::string_view value) {
    Key(key);
    Quote(value);
    return *this;
  }
  // `object_json` must be a complete JSON object (e.g. another writer's Finish()).
  JsonWriter& Object(absl::string_view key, absl::string_view object_json) {
    Key(key);
    out_.append(object_json.data(), object_json.size());
    return *this;
  }

  // `objects_json`: complete JSON objects, written as an array.
  JsonWriter& Objects(absl::string_view key, const std::vector<std::string>& objects_json) {
    Key(key);
    out_ += "[";
    for (size_t i = 0; i < objects_json.size(); ++i) {
      if (i > 0) out_ += ",";
      out_ += objects_json[i];
    }
    out_ += "]";
    return *this;
  }

  std::string Finish() const { return out_ + "}"; }

 private:
  void Key(absl::string_view key) {
    if (out_.size() > 1) out_ += ",";
    Quote(key);
    out_ += ":";
  }
  void Quote(absl::string_view s) {
    out_ += '"';
    for (char c : s) {
      switch (c) {
        case '"': out_ += "\\\""; break;
        case '\\': out_ += "\\\\"; break;
        case '\n': out_ += "\\n"; break;
        case '\r': out_ += "\\r"; break;
        case '\t': out_ += "\\t"; break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            absl::StrAppend(&out_, absl::StrFormat("\\u%04x", static_cast<unsigned char>(c)));
          } else {
            out_ += c;
          }
      }
    }
    out_ += '"';
  }

  std::string out_ = "{";
};

}  // namespace retrybudget::fleet

#endif  // RETRYBUDGET_TOOLS_FLEET_JSON_WRITER_H_
