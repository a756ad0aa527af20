#include "retrybudget/names.h"

#include <array>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace retrybudget {
namespace {

// [A-Za-z0-9._:/-], as a table: one load per character (a Sync checks every entry's name).
constexpr std::array<bool, 256> kTenantChars = [] {
  std::array<bool, 256> table{};
  for (int c = 0; c < 256; ++c) {
    table[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
               c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
  }
  return table;
}();

bool IsTenantChar(char c) { return kTenantChars[static_cast<unsigned char>(c)]; }

}  // namespace

std::string QuoteForError(absl::string_view value) {
  constexpr size_t kMax = 40;
  std::string shown(value.substr(0, kMax));
  for (char& c : shown) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) c = '?';
  }
  return absl::StrCat("\"", shown, value.size() > kMax ? "...\"" : "\"");
}

bool IsValidTenantName(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantNameLength) return false;
  for (char c : tenant) {
    if (!IsTenantChar(c)) return false;
  }
  return true;
}

absl::Status ValidateTenantName(absl::string_view tenant, absl::string_view field) {
  if (tenant.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty; a tenant name has 1-",
                                                   kMaxTenantNameLength,
                                                   " characters of [A-Za-z0-9._:/-]"));
  }
  if (tenant.size() > kMaxTenantNameLength) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", QuoteForError(tenant), " has ",
                                                   tenant.size(), " characters; at most ",
                                                   kMaxTenantNameLength, " are allowed"));
  }
  for (size_t i = 0; i < tenant.size(); ++i) {
    if (!IsTenantChar(tenant[i])) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %s has character 0x%02x at position %d; allowed are [A-Za-z0-9._:/-]", field,
          QuoteForError(tenant), static_cast<unsigned char>(tenant[i]), i));
    }
  }
  return absl::OkStatus();
}

bool IsValidInstanceId(absl::string_view id) {
  if (id.empty() || id.size() > kMaxInstanceIdLength) return false;
  for (char c : id) {
    // 0x21-0x7e, as one unsigned comparison.
    if (static_cast<unsigned char>(static_cast<unsigned char>(c) - 0x21) > 0x7e - 0x21) {
      return false;
    }
  }
  return true;
}

absl::Status ValidateInstanceId(absl::string_view id, absl::string_view field) {
  if (id.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is empty"));
  }
  if (id.size() > kMaxInstanceIdLength) {
    return absl::InvalidArgumentError(absl::StrCat(field, " ", QuoteForError(id), " has ",
                                                   id.size(), " characters; at most ",
                                                   kMaxInstanceIdLength, " are allowed"));
  }
  for (size_t i = 0; i < id.size(); ++i) {
    const auto c = static_cast<unsigned char>(id[i]);
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s %s has character 0x%02x at position %d; allowed is printable ASCII", field,
          QuoteForError(id), c, i));
    }
  }
  return absl::OkStatus();
}

}  // namespace retrybudget
