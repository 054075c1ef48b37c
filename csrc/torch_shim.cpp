// The C++ half of rrmm's PyTorch pluggable allocator (see src/python/torch_alloc.rs).
//
// PyTorch does not check the pointer its pluggable allocator returns: an allocation failure must
// reach it as a C++ exception. Rust cannot throw one, so the exported entry point
// `rrmm_torch_allocate` (Rust, `extern "C-unwind"`) calls `rrmm_torch_throw_bad_alloc` here on
// failure; the exception unwinds through that Rust frame (allowed by the "C-unwind" ABI) into
// PyTorch, which turns it into a Python exception whose text is rrmm's message. No PyTorch
// headers are needed.

#include <cstddef>
#include <cstring>
#include <new>
#include <string>

namespace {

// A std::bad_alloc that carries rrmm's message (std::bad_alloc's own what() is fixed).
class rrmm_bad_alloc : public std::bad_alloc {
 public:
  explicit rrmm_bad_alloc(const char* message) : message_(message ? message : "rrmm: out of memory") {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

}  // namespace

extern "C" {

// Throws rrmm_bad_alloc with a copy of `message` (NUL-terminated, may be null). Never returns.
[[noreturn]] void rrmm_torch_throw_bad_alloc(const char* message) { throw rrmm_bad_alloc(message); }

// Exported by the Rust side.
void* rrmm_torch_allocate(std::size_t size, int device, void* stream);

// For rrmm's own tests: calls rrmm_torch_allocate as PyTorch would, catching what it throws.
// Returns 0 and stores the pointer on success; returns 1 and copies what() into `message`
// (truncated to `capacity` bytes, NUL-terminated) when a std::bad_alloc was thrown; returns 2
// for any other exception.
int rrmm_torch_shim_call_allocate(std::size_t size, int device, void* stream, void** out,
                                  char* message, std::size_t capacity) {
  try {
    *out = rrmm_torch_allocate(size, device, stream);
    return 0;
  } catch (const std::bad_alloc& e) {
    if (message != nullptr && capacity > 0) {
      std::strncpy(message, e.what(), capacity - 1);
      message[capacity - 1] = '\0';
    }
    return 1;
  } catch (...) {
    return 2;
  }
}

}  // extern "C"
