// A stand-in for PyTorch's libc10.so, for tests/python/test_torch_out_of_memory.py: the parts
// of c10::Error and c10::OutOfMemoryError that rrmm's PyTorch shim (csrc/torch_shim.cpp) looks
// up, a caller that catches as PyTorch's Python layer does, and a counting __cxa_throw (the
// shim must throw through the runtime of the library it found, never its own).
//
// FAKE_C10_LAYOUT picks the "PyTorch version" (built with the system's g++ and libstdc++):
//   1  as in the PyTorch releases rrmm was tested with: OutOfMemoryError adds nothing to Error,
//      whose vtable is 48 bytes (two destructors, what(), what_without_backtrace()); its data
//      members differ from PyTorch's (the shim must not depend on them);
//   2  a future PyTorch whose OutOfMemoryError adds a virtual function and a member;
//   3  a future PyTorch whose OutOfMemoryError adds only a member (undetectable from outside:
//      only the version gate protects it).
#include <cxxabi.h>
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#ifndef FAKE_C10_LAYOUT
#define FAKE_C10_LAYOUT 1
#endif

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
#if FAKE_C10_LAYOUT == 1
class __attribute__((visibility("default"))) OutOfMemoryError : public Error {
  using Error::Error;
};
#elif FAKE_C10_LAYOUT == 2
class __attribute__((visibility("default"))) OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(SourceLocation loc, std::string msg)
      : Error(loc, std::move(msg)), detail_(64, 'x') {}
  virtual std::size_t requested() const noexcept { return detail_.size(); }
 private:
  std::vector<char> detail_;
};
#else
class __attribute__((visibility("default"))) OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(SourceLocation loc, std::string msg)
      : Error(loc, std::move(msg)), detail_(64, 'x') {}
 private:
  std::vector<char> detail_;
};
#endif
}  // namespace c10

namespace {
int g_throws = 0;
char g_type[256];
}

// Counts the throws that go through this library's runtime, then throws with libstdc++'s.
extern "C" __attribute__((visibility("default"))) void __cxa_throw(void* object, void* type,
                                                                  void (*destroy)(void*)) {
  ++g_throws;
  using Throw = void (*)(void*, void*, void (*)(void*));
  static Throw real = reinterpret_cast<Throw>(dlsym(RTLD_NEXT, "__cxa_throw"));
  real(object, type, destroy);
  __builtin_unreachable();
}

extern "C" __attribute__((visibility("default"))) int fake_c10_throws() { return g_throws; }

// The mangled name of the type last caught by fake_torch_allocate.
extern "C" __attribute__((visibility("default"))) const char* fake_c10_caught_type() {
  return g_type;
}

// Makes the compiler emit OutOfMemoryError's vtable and type_info here, as PyTorch's libraries do.
extern "C" __attribute__((visibility("default"))) void fake_c10_throw() {
  throw c10::OutOfMemoryError({"f", "x", 1}, "fake");
}

// Calls `allocate` (rrmm_torch_allocate) as PyTorch would: 0 a pointer, 6 null, 1
// OutOfMemoryError (its what_without_backtrace copied), 2 another c10::Error, 5 a
// std::bad_alloc, 3 another std::exception (what() copied), 4 anything else.
extern "C" __attribute__((visibility("default"))) int fake_torch_allocate(
    void* (*allocate)(std::size_t, int, void*), std::size_t size, char* out, std::size_t cap) {
  auto note = [&](const char* text) {
    std::strncpy(out, text, cap - 1);
    out[cap - 1] = '\0';
    const std::type_info* type = abi::__cxa_current_exception_type();
    std::strncpy(g_type, type ? type->name() : "", sizeof g_type - 1);
  };
  try {
    return allocate(size, 0, nullptr) != nullptr ? 0 : 6;
  } catch (const c10::OutOfMemoryError& e) {
    note(e.what_without_backtrace());
    return 1;
  } catch (const c10::Error& e) {
    note(e.what());
    return 2;
  } catch (const std::bad_alloc& e) {
    note(e.what());
    return 5;
  } catch (const std::exception& e) {
    note(e.what());
    return 3;
  } catch (...) {
    note("");
    return 4;
  }
}
