// The C++ half of rrmm's PyTorch pluggable allocator (see src/python/hooks/torch.rs).
//
// PyTorch does not check the pointer its pluggable allocator returns: an allocation failure must
// reach it as a C++ exception. Rust cannot throw one, so the exported entry point
// `rrmm_torch_allocate` (Rust, `extern "C-unwind"`) calls `rrmm_torch_throw_out_of_memory` here
// on failure; the exception unwinds through that Rust frame (allowed by the "C-unwind" ABI) into
// PyTorch, which turns it into a Python exception whose text is rrmm's message.
//
// Which exception: PyTorch's own allocator throws `c10::OutOfMemoryError`, which PyTorch's
// Python layer turns into `torch.cuda.OutOfMemoryError` (code catches that). The class lives in
// PyTorch's C++ library, which an abi3 wheel built without PyTorch cannot link, so it is found at
// run time in the PyTorch libraries already loaded in the process (never loading one): its
// exported constructor `c10::Error::Error(c10::SourceLocation, std::string)`, the vtable and the
// type_info of `c10::OutOfMemoryError`. The object is built by PyTorch's own constructor (so its
// layout is whatever that PyTorch's is) and given OutOfMemoryError's vtable, which is all that
// class adds to c10::Error (`class OutOfMemoryError : public Error { using Error::Error; }`).
// It is thrown by the C++ runtime PyTorch uses (libstdc++'s __cxa_throw, found the same way), so
// PyTorch's handlers recognise it whichever C++ library this shim was built with. When any of
// those symbols is missing (no PyTorch loaded, a PyTorch built with the old string ABI, a future
// rename), a std::bad_alloc carrying rrmm's message is thrown instead, which PyTorch reports as a
// RuntimeError: the behaviour of RMM's hook. No PyTorch headers are needed.

#include <dlfcn.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <string>

namespace c10 {
// PyTorch's c10::SourceLocation (c10/util/StringUtil.h): three plain fields, passed by value.
struct SourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};
}  // namespace c10

namespace {

// A std::bad_alloc that carries rrmm's message (std::bad_alloc's own what() is fixed).
class rrmm_bad_alloc : public std::bad_alloc {
 public:
  explicit rrmm_bad_alloc(const char* message) : message_(message ? message : "rrmm: out of memory") {}
  const char* what() const noexcept override { return message_.c_str(); }

 private:
  std::string message_;
};

// libstdc++'s std::string of the C++11 ABI, the type PyTorch's constructor takes, laid out by
// hand: the shim may be built with another C++ library (a release wheel links zig's libc++),
// whose std::string differs. Its heap text comes from libstdc++'s operator new, as PyTorch
// frees it with libstdc++'s operator delete.
struct LibstdcxxString {
  char* data;
  std::size_t length;
  union {
    char local[16];
    std::size_t capacity;
  };
};
static_assert(sizeof(LibstdcxxString) == 32, "libstdc++'s std::string is 32 bytes");

// `c10::Error::Error(c10::SourceLocation, std::string)` called as a function whose first
// argument is the object: the Itanium C++ ABI passes `this` first, the trivially copyable
// location in memory, and the string (a non-trivial type) by the address of a temporary that
// the caller destroys.
using ErrorConstructor = void (*)(void* self, c10::SourceLocation, LibstdcxxString* message);

// What throwing PyTorch's out-of-memory exception needs from the process, all from the C++
// library PyTorch itself uses (libstdc++), so PyTorch's handlers recognise the exception.
struct TorchOutOfMemory {
  ErrorConstructor construct = nullptr;
  void* const* vtable = nullptr;  // the vtable symbol; an object's vptr is vtable + 2
  void* type = nullptr;           // the std::type_info of c10::OutOfMemoryError
  void* (*allocate_exception)(std::size_t) = nullptr;
  [[noreturn]] void (*throw_exception)(void*, void*, void (*)(void*)) = nullptr;
  void* (*operator_new)(std::size_t) = nullptr;
  void (*operator_delete)(void*) = nullptr;

  bool usable() const {
    return construct != nullptr && vtable != nullptr && type != nullptr &&
           allocate_exception != nullptr && throw_exception != nullptr &&
           operator_new != nullptr && operator_delete != nullptr;
  }
};

// The PyTorch libraries that may define the symbols, by soname; only already-loaded ones.
constexpr const char* kTorchLibraries[] = {"libc10.so", "libc10_cuda.so", "libtorch_cuda.so",
                                           "libtorch_cpu.so", "libtorch_python.so"};

// A symbol of an already-loaded library (never loads one). The handle is kept: a loaded PyTorch
// or C++ runtime library is not unloaded while PyTorch is in use.
void* find_in(const char* library, const char* name) {
  void* handle = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
  return handle == nullptr ? nullptr : dlsym(handle, name);
}

void* find_in_torch(const char* name) {
  for (const char* library : kTorchLibraries) {
    if (void* symbol = find_in(library, name)) return symbol;
  }
  return nullptr;
}

template <typename F>
F as_function(void* symbol) {
  return reinterpret_cast<F>(symbol);
}

TorchOutOfMemory look_up_torch_out_of_memory() {
  TorchOutOfMemory found;
  void* construct = find_in_torch(
      "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
  if (construct == nullptr) {
    construct = find_in_torch(
        "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE");
  }
  found.construct = as_function<ErrorConstructor>(construct);
  found.vtable = static_cast<void* const*>(find_in_torch("_ZTVN3c1016OutOfMemoryErrorE"));
  found.type = find_in_torch("_ZTIN3c1016OutOfMemoryErrorE");
  const char* runtime = "libstdc++.so.6";
  found.allocate_exception = as_function<void* (*)(std::size_t)>(
      find_in(runtime, "__cxa_allocate_exception"));
  found.throw_exception = as_function<void (*)(void*, void*, void (*)(void*))>(
      find_in(runtime, "__cxa_throw"));
  found.operator_new = as_function<void* (*)(std::size_t)>(find_in(runtime, "_Znwm"));
  found.operator_delete = as_function<void (*)(void*)>(find_in(runtime, "_ZdlPv"));
  return found;
}

// Looked up on each failure until PyTorch is found (PyTorch may be imported after rrmm), then
// kept. Allocation failures are rare, so the lookups cost nothing that matters.
TorchOutOfMemory torch_out_of_memory() {
  static std::mutex lock;
  static TorchOutOfMemory cached;
  std::lock_guard<std::mutex> guard(lock);
  if (!cached.usable()) cached = look_up_torch_out_of_memory();
  return cached;
}

// Room for a c10::Error of any PyTorch release (about 200 bytes today).
constexpr std::size_t kErrorObjectBytes = 1024;

// The exception object's destructor, as __cxa_throw wants it: the complete-object destructor,
// the first virtual slot of the object's vtable (c10::OutOfMemoryError's).
void destroy_error(void* object) {
  using Destructor = void (*)(void*);
  void* const* vptr = *static_cast<void* const* const*>(object);
  reinterpret_cast<Destructor>(vptr[0])(object);
}

[[noreturn]] void throw_torch_out_of_memory(const TorchOutOfMemory& oom, const char* text) {
  std::size_t length = std::strlen(text);
  LibstdcxxString message{};
  message.data = static_cast<char*>(oom.operator_new(length + 1));
  std::memcpy(message.data, text, length + 1);
  message.length = length;
  message.capacity = length;
  void* object = oom.allocate_exception(kErrorObjectBytes);
  std::memset(object, 0, kErrorObjectBytes);
  oom.construct(object, c10::SourceLocation{"rrmm_torch_allocate", "rrmm", 0}, &message);
  // The caller's half of passing the string by value: destroy the (moved-from) temporary.
  if (message.data != message.local) oom.operator_delete(message.data);
  *static_cast<void* const**>(object) = oom.vtable + 2;
  oom.throw_exception(object, oom.type, destroy_error);
}

}  // namespace

extern "C" {

// Throws PyTorch's c10::OutOfMemoryError when PyTorch is loaded, else rrmm_bad_alloc, with a
// copy of `message` (NUL-terminated, may be null). Never returns.
[[noreturn]] void rrmm_torch_throw_out_of_memory(const char* message) {
  const char* text = message ? message : "rrmm: out of memory";
  TorchOutOfMemory oom = torch_out_of_memory();
  if (oom.usable()) throw_torch_out_of_memory(oom, text);
  throw rrmm_bad_alloc(text);
}

// Exported by the Rust side.
void* rrmm_torch_allocate(std::size_t size, int device, void* stream);

// For rrmm's own tests: calls rrmm_torch_allocate as PyTorch would, catching what it throws.
// Returns 0 and stores the pointer on success; returns 1 and copies what() into `message`
// (truncated to `capacity` bytes, NUL-terminated) when a std::bad_alloc was thrown; returns 3
// the same way for any other std::exception (PyTorch's OutOfMemoryError is one); returns 2 for
// anything else.
int rrmm_torch_shim_call_allocate(std::size_t size, int device, void* stream, void** out,
                                  char* message, std::size_t capacity) {
  auto copy = [&](const char* text) {
    if (message != nullptr && capacity > 0) {
      std::strncpy(message, text, capacity - 1);
      message[capacity - 1] = '\0';
    }
  };
  try {
    *out = rrmm_torch_allocate(size, device, stream);
    return 0;
  } catch (const std::bad_alloc& e) {
    copy(e.what());
    return 1;
  } catch (const std::exception& e) {
    copy(e.what());
    return 3;
  } catch (...) {
    return 2;
  }
}

}  // extern "C"
