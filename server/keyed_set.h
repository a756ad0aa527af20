// The server's tables of shared records found by a name the record holds itself (a tenant by
// its name, an instance by its id): a hash set of RefPtr (ref_ptr.h), looked up by string_view.
//
// A map from a copy of the name to a shared_ptr stores the name twice and takes a 48-byte slot
// (string + shared_ptr); this takes 8, which at a million tenants is ~80 MB less for the slot
// array alone (docs/BENCHMARKS.md section 4a).
//
//   SharedByName<Tenant, &Tenant::name> tenants;
//   tenants.insert(MakeRef<Tenant>(...));
//   auto it = tenants.find(absl::string_view("tenant-a"));  // *it is the RefPtr
//
// The name must not change while the record is in the set (it is const in both records).
#ifndef RETRYBUDGET_SERVER_KEYED_SET_H_
#define RETRYBUDGET_SERVER_KEYED_SET_H_

#include <cstddef>
#include <functional>
#include <string>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "server/ref_ptr.h"

namespace retrybudget {

// Hash and equality of records of type T (or RefPtrs to them) by their name, looked up by an
// absl::string_view. kName: a member holding the name (a std::string or an absl::string_view),
// or a const member function returning it.
template <typename T, auto kName>
struct NameOf {
  using is_transparent = void;

  static absl::string_view Of(absl::string_view name) { return name; }
  static absl::string_view Of(const T& record) {
    return absl::string_view(std::invoke(kName, record));
  }
  static absl::string_view Of(const RefPtr<T>& record) { return Of(*record); }

  struct Hash {
    using is_transparent = void;
    template <typename K>
    size_t operator()(const K& k) const {
      return absl::Hash<absl::string_view>{}(Of(k));
    }
  };
  struct Eq {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return Of(a) == Of(b);
    }
  };
};

template <typename T, auto kName>
using SharedByName = absl::flat_hash_set<RefPtr<T>, typename NameOf<T, kName>::Hash,
                                         typename NameOf<T, kName>::Eq>;

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_KEYED_SET_H_
