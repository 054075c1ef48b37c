// A stand-in for PyTorch's libc10.so, for tests/python/test_torch_out_of_memory.py: the parts
// of c10::Error and c10::OutOfMemoryError that rrmm's PyTorch shim (csrc/torch_shim.cpp) looks
// up, laid out differently from PyTorch's (the shim must not depend on the layout), and a caller
// that catches as PyTorch's Python layer does.
#include <cstdint>
#include <exception>
#include <string>
#include <dlfcn.h>
#include <cstring>
namespace c10 {
struct SourceLocation { const char* function; const char* file; std::uint32_t line; };
class __attribute__((visibility("default"))) Error : public std::exception {
  std::string msg_;
  std::string what_;
 public:
  Error(SourceLocation loc, std::string msg);
  const char* what() const noexcept override { return what_.c_str(); }
  virtual const char* what_without_backtrace() const noexcept { return msg_.c_str(); }
};
Error::Error(SourceLocation loc, std::string msg) : msg_(std::move(msg)) {
  what_ = msg_ + " (raised from " + loc.function + ")";
}
class __attribute__((visibility("default"))) OutOfMemoryError : public Error { using Error::Error; };
}
// Makes the compiler emit OutOfMemoryError's vtable and type_info here, as PyTorch's libraries do.
extern "C" __attribute__((visibility("default"))) void fake_c10_throw() {
  throw c10::OutOfMemoryError({"f", "x", 1}, "fake");
}
// Calls `allocate` (rrmm_torch_allocate) as PyTorch would: 0 ok, 1 OutOfMemoryError (its
// what_without_backtrace copied), 2 another c10::Error, 3 another std::exception, 4 other.
extern "C" __attribute__((visibility("default"))) int fake_torch_allocate(
    void* (*allocate)(std::size_t, int, void*), std::size_t size, char* out, std::size_t cap) {
  try {
    allocate(size, 0, nullptr);
    return 0;
  } catch (const c10::OutOfMemoryError& e) {
    std::strncpy(out, e.what_without_backtrace(), cap - 1);
    return 1;
  } catch (const c10::Error& e) {
    return 2;
  } catch (const std::exception& e) {
    std::strncpy(out, e.what(), cap - 1);
    return 3;
  } catch (...) {
    return 4;
  }
}
