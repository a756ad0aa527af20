// An intrusive reference count for the server's per-tenant and per-instance records. A record
// derives from RefCounted (4 bytes, which a 4-byte first member such as a CompactMutex fills to
// a word) and is shared through RefPtr (8 bytes). A std::shared_ptr is 16 bytes and its record
// carries a 16-byte control block: at a million tenants the two cost ~35 MB more (the tables'
// slots and the blocks; docs/BENCHMARKS.md section 4a).
//
//   RefPtr<Tenant> t = MakeRef<Tenant>(name, ...);
//   RefPtr<Tenant> u = t;  // one more reference; the record is deleted with the last one
//
// Thread-safe as shared_ptr is: copies and destructions of RefPtrs to one record may race, a
// single RefPtr object may not be written while it is read.
#ifndef RETRYBUDGET_SERVER_REF_PTR_H_
#define RETRYBUDGET_SERVER_REF_PTR_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

namespace retrybudget {

template <typename T>
class RefPtr;

class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;

 protected:
  ~RefCounted() = default;

 private:
  template <typename T>
  friend class RefPtr;
  // 2^32 references would take 32 GiB of pointers.
  mutable std::atomic<uint32_t> refs_{0};
};

template <typename T>
class RefPtr {
 public:
  RefPtr() = default;
  RefPtr(std::nullptr_t) {}  // NOLINT: converts implicitly, as shared_ptr's does
  RefPtr(const RefPtr& other) : p_(other.p_) { Ref(p_); }
  RefPtr(RefPtr&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  RefPtr& operator=(const RefPtr& other) {
    RefPtr(other).swap(*this);
    return *this;
  }
  RefPtr& operator=(RefPtr&& other) noexcept {
    RefPtr(std::move(other)).swap(*this);
    return *this;
  }
  ~RefPtr() { Unref(p_); }

  // Takes the first reference of a record just made with `new` its own way (Instance::Create
  // places its id after the record, in the same allocation); MakeRef otherwise.
  static RefPtr AdoptNew(T* fresh) { return RefPtr(fresh); }

  void reset() { RefPtr().swap(*this); }
  void swap(RefPtr& other) noexcept { std::swap(p_, other.p_); }

  T* get() const { return p_; }
  // True when this is the record's only reference (another thread may copy it only from a
  // reference of its own, so the answer stays true until this one is copied).
  bool IsOnlyReference() const {
    return p_ != nullptr && Count(p_).load(std::memory_order_acquire) == 1;
  }
  T& operator*() const { return *p_; }
  T* operator->() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }

  friend bool operator==(const RefPtr& a, const RefPtr& b) { return a.p_ == b.p_; }
  friend bool operator==(const RefPtr& a, std::nullptr_t) { return a.p_ == nullptr; }

 private:
  template <typename U, typename... Args>
  friend RefPtr<U> MakeRef(Args&&... args);

  // Takes the first reference of a new record.
  explicit RefPtr(T* fresh) : p_(fresh) { Ref(p_); }

  static void Ref(T* p) {
    if (p != nullptr) Count(p).fetch_add(1, std::memory_order_relaxed);
  }
  static void Unref(T* p) {
    // acq_rel: every write to the record by other holders happens before its deletion.
    if (p != nullptr && Count(p).fetch_sub(1, std::memory_order_acq_rel) == 1) delete p;
  }
  static std::atomic<uint32_t>& Count(T* p) { return static_cast<const RefCounted*>(p)->refs_; }

  T* p_ = nullptr;
};

// A new record of type T, shared. T derives from RefCounted and is final (it is deleted as a T).
template <typename T, typename... Args>
RefPtr<T> MakeRef(Args&&... args) {
  static_assert(std::is_base_of_v<RefCounted, T> && std::is_final_v<T>);
  return RefPtr<T>(new T(std::forward<Args>(args)...));
}

}  // namespace retrybudget

#endif  // RETRYBUDGET_SERVER_REF_PTR_H_
