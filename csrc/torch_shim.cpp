// The C++ half of rrmm's PyTorch pluggable allocator (see src/python/hooks/torch_pluggable.rs).
//
// PyTorch does not check the pointer its pluggable allocator returns (CUDAPluggableAllocator::
// allocate wraps whatever comes back in a DataPtr): an allocation failure must reach it as a C++
// exception. Rust cannot throw one, so the exported entry point `rrmm_torch_allocate` (Rust,
// `extern "C-unwind"`) calls `rrmm_torch_raise_out_of_memory` here on failure; the exception
// unwinds through that Rust frame (allowed by the "C-unwind" ABI; the frame owns nothing to drop,
// so it has no personality routine either) into PyTorch, which turns it into a Python exception
// whose text is rrmm's message.
//
// Whose C++ runtime: PyTorch's. The exception is allocated and thrown by the `__cxa_*` functions
// of the C++ library PyTorch's own libraries use, found with dlsym on the handle of an already
// loaded PyTorch library (libc10.so first; dlsym on a handle searches that library and its
// dependencies, so this is the libstdc++ libc10.so was linked against). PyTorch's catch clauses
// and unwinder then recognise it whichever C++ library this shim was built with: the release
// wheel is built with zig, whose libc++ is not PyTorch's libstdc++, and an exception thrown by
// the shim's own runtime would be foreign to PyTorch. Nothing here throws with the shim's runtime.
//
// Which exception:
// - PyTorch's own allocator throws `c10::OutOfMemoryError`, which PyTorch's Python layer turns into
//   `torch.cuda.OutOfMemoryError` (code catches that). The class lives in PyTorch's C++ library,
//   which an abi3 wheel built without PyTorch cannot link, and none of its constructors is
//   exported, so the object is built by the exported `c10::Error::Error(c10::SourceLocation,
//   std::string)` and given OutOfMemoryError's vtable: correct only while OutOfMemoryError adds
//   nothing to c10::Error (`class OutOfMemoryError : public Error { using Error::Error; }`). That
//   holds for the PyTorch versions rrmm was tested with, which the Rust side passes here (the
//   expected size of the vtable, from `torch.__version__`; 0 for any other version), and it is
//   checked as far as the loaded library allows before each use: both type_infos are
//   single-inheritance ones of this runtime, OutOfMemoryError's base is c10::Error, both vtables
//   have the tested size and OutOfMemoryError does not override what(). Anything else (another
//   PyTorch version, a failed check, a missing symbol) gets the fallback.
// - The fallback: `rrmm::out_of_memory`, a std::bad_alloc carrying rrmm's message, built here from
//   the runtime's own std::bad_alloc type_info (a single-inheritance type_info and a vtable of
//   destructor and what(), both fixed by the Itanium C++ ABI): PyTorch reports it as a
//   RuntimeError (a MemoryError where pybind11 translates it), RMM's hook's behaviour (RMM throws
//   rmm::out_of_memory, a std::bad_alloc).
// - When no PyTorch library or runtime is loaded (the entry point called by something else), no
//   exception can safely be thrown: the failure is said once on standard error and the allocator
//   returns null, which PyTorch's MemPool path turns into its own OutOfMemoryError (and its plain
//   pluggable path does not check; see docs/torch_oom_upstream.md).
// No PyTorch headers are needed.
//
// Built without C++ exceptions (build.rs): no function here has a landing pad, so none has a
// personality routine for PyTorch's unwinder to call (the one of zig's C++ runtime, linked into a
// release wheel, would crash under libgcc's unwinder). Everything is thrown by PyTorch's runtime.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE  // dladdr1
#endif
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace c10 {
// PyTorch's c10::SourceLocation (c10/util/Exception.h): three plain fields, passed by value.
struct SourceLocation {
  const char* function;
  const char* file;
  std::uint32_t line;
};
}  // namespace c10

namespace {

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
using AllocateException = void* (*)(std::size_t);
using Destructor = void (*)(void*);
// `__cxa_throw` never returns; the attribute goes on the call site's function, not the pointer
// (clang accepts `[[noreturn]]` only on functions).
using ThrowException = void (*)(void* object, void* type, Destructor destroy);
using OperatorNew = void* (*)(std::size_t);
using OperatorDelete = void (*)(void*);

// A type_info of the Itanium C++ ABI for a class with one public non-virtual base
// (`__cxxabiv1::__si_class_type_info`): its vptr, its mangled name and its base's type_info.
struct SiClassTypeInfo {
  const void* vptr;
  const char* name;
  const void* base;
};

// The symbols' mangled names.
constexpr const char* kErrorConstructorC1 =
    "_ZN3c105ErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
constexpr const char* kErrorConstructorC2 =
    "_ZN3c105ErrorC2ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE";
constexpr const char* kOutOfMemoryVtable = "_ZTVN3c1016OutOfMemoryErrorE";
constexpr const char* kOutOfMemoryType = "_ZTIN3c1016OutOfMemoryErrorE";
constexpr const char* kErrorVtable = "_ZTVN3c105ErrorE";
constexpr const char* kErrorType = "_ZTIN3c105ErrorE";
constexpr const char* kErrorName = "N3c105ErrorE";
constexpr const char* kOutOfMemoryName = "N3c1016OutOfMemoryErrorE";
constexpr const char* kExceptionName = "St9exception";
constexpr const char* kSiClassTypeInfoVtable = "_ZTVN10__cxxabiv120__si_class_type_infoE";
constexpr const char* kBadAllocType = "_ZTISt9bad_alloc";

// The PyTorch libraries whose handles are searched, by soname, only already-loaded ones (never
// loading one): libc10.so defines c10::Error, libc10_cuda.so OutOfMemoryError's vtable. The
// handles are kept: a loaded PyTorch library is not unloaded while PyTorch is in use.
constexpr const char* kTorchLibraries[] = {"libc10.so", "libc10_cuda.so", "libtorch_cuda.so",
                                           "libtorch_cpu.so", "libtorch_python.so"};
constexpr std::size_t kLibraryCount = sizeof(kTorchLibraries) / sizeof(kTorchLibraries[0]);

// A library given by rrmm's own Rust tests (no PyTorch there) to search after PyTorch's.
std::atomic<const char*> g_test_library{nullptr};

struct Handles {
  void* library[kLibraryCount + 1] = {};
  bool any() const {
    for (void* handle : library) {
      if (handle != nullptr) return true;
    }
    return false;
  }
  void* find(const char* name) const {
    for (void* handle : library) {
      if (handle == nullptr) continue;
      if (void* symbol = dlsym(handle, name)) return symbol;
    }
    return nullptr;
  }
};

Handles loaded_torch_libraries() {
  Handles handles;
  for (std::size_t i = 0; i < kLibraryCount; ++i) {
    handles.library[i] = dlopen(kTorchLibraries[i], RTLD_LAZY | RTLD_NOLOAD);
  }
  if (const char* library = g_test_library.load()) {
    handles.library[kLibraryCount] = dlopen(library, RTLD_LAZY | RTLD_NOLOAD);
  }
  return handles;
}

// The size of the ELF symbol that starts at `address` (0 when unknown).
std::size_t symbol_bytes(const void* address) {
  Dl_info info;
  void* entry = nullptr;  // a `const ElfW(Sym)*`
  if (dladdr1(address, &info, &entry, RTLD_DL_SYMENT) == 0 || entry == nullptr ||
      info.dli_saddr != address) {
    return 0;
  }
  return static_cast<const ElfW(Sym)*>(entry)->st_size;
}

// The C++ runtime of the loaded PyTorch: what throwing any exception needs.
struct Runtime {
  AllocateException allocate_exception = nullptr;
  ThrowException throw_exception = nullptr;
  OperatorNew operator_new = nullptr;
  OperatorDelete operator_delete = nullptr;
  const void* bad_alloc_type = nullptr;
  const void* const* si_class_type_info_vtable = nullptr;  // the symbol; vptr = symbol + 2

  bool usable() const {
    return allocate_exception != nullptr && throw_exception != nullptr &&
           operator_new != nullptr && operator_delete != nullptr && bad_alloc_type != nullptr &&
           si_class_type_info_vtable != nullptr;
  }
  // Whether `type` is a single-inheritance type_info of this runtime, of the ABI's size.
  bool is_si_class_type(const void* type) const {
    const auto* info = static_cast<const SiClassTypeInfo*>(type);
    return symbol_bytes(type) == sizeof(SiClassTypeInfo) &&
           info->vptr == static_cast<const void*>(si_class_type_info_vtable + 2);
  }
};

template <typename F>
F as_function(void* symbol) {
  return reinterpret_cast<F>(symbol);
}

Runtime find_runtime(const Handles& handles) {
  Runtime runtime;
  runtime.allocate_exception =
      as_function<AllocateException>(handles.find("__cxa_allocate_exception"));
  runtime.throw_exception = as_function<ThrowException>(handles.find("__cxa_throw"));
  runtime.operator_new = as_function<OperatorNew>(handles.find("_Znwm"));
  runtime.operator_delete = as_function<OperatorDelete>(handles.find("_ZdlPv"));
  runtime.bad_alloc_type = handles.find(kBadAllocType);
  runtime.si_class_type_info_vtable =
      static_cast<const void* const*>(handles.find(kSiClassTypeInfoVtable));
  return runtime;
}

// c10::OutOfMemoryError as the tested PyTorch versions lay it out.
struct OutOfMemoryError {
  ErrorConstructor construct = nullptr;
  const void* const* vtable = nullptr;  // the vtable symbol; an object's vptr is vtable + 2
  void* type = nullptr;                 // its std::type_info

  bool usable() const { return construct != nullptr && vtable != nullptr && type != nullptr; }
};

bool has_name(const void* type, const char* name) {
  const char* found = static_cast<const SiClassTypeInfo*>(type)->name;
  return found != nullptr && std::strcmp(found, name) == 0;
}

// Why the loaded PyTorch's OutOfMemoryError is not laid out as tested, or null when it is.
const char* layout_mismatch(const Handles& handles, const Runtime& runtime,
                            const OutOfMemoryError& oom, std::size_t vtable_bytes) {
  const void* error_type = handles.find(kErrorType);
  const auto* error_vtable = static_cast<const void* const*>(handles.find(kErrorVtable));
  if (error_type == nullptr || error_vtable == nullptr) return "c10::Error's symbols are missing";
  if (!runtime.is_si_class_type(oom.type) || !runtime.is_si_class_type(error_type)) {
    return "a type_info is not a single-inheritance one of PyTorch's C++ runtime";
  }
  const void* base = static_cast<const SiClassTypeInfo*>(oom.type)->base;
  if (base != error_type && !has_name(base, kErrorName)) {
    return "OutOfMemoryError's base is not c10::Error";
  }
  if (!has_name(static_cast<const SiClassTypeInfo*>(error_type)->base, kExceptionName)) {
    return "c10::Error's base is not std::exception";
  }
  if (symbol_bytes(oom.vtable) != vtable_bytes || symbol_bytes(error_vtable) != vtable_bytes) {
    return "a vtable's size differs from the tested one (a virtual function was added)";
  }
  // [0] offset to top, [1] type_info, [2] and [3] the destructors, [4] what(). The type_info a
  // vtable points to is compared by name: a type_info exported by several of PyTorch's libraries
  // (libc10_cuda and libtorch_cuda in the CUDA 13 builds of 2.11) has one copy per library, and
  // the symbol looked up need not be the copy the vtable was bound to (seen on the H100 image).
  if (oom.vtable[0] != nullptr || oom.vtable[1] == nullptr || error_vtable[1] == nullptr ||
      !runtime.is_si_class_type(oom.vtable[1]) || !has_name(oom.vtable[1], kOutOfMemoryName) ||
      !has_name(error_vtable[1], kErrorName)) {
    return "a vtable's header differs from the ABI's";
  }
  if (oom.vtable[4] != error_vtable[4]) return "OutOfMemoryError overrides what()";
  return nullptr;
}

OutOfMemoryError find_out_of_memory_error(const Handles& handles) {
  OutOfMemoryError oom;
  void* construct = handles.find(kErrorConstructorC1);
  if (construct == nullptr) construct = handles.find(kErrorConstructorC2);
  oom.construct = as_function<ErrorConstructor>(construct);
  oom.vtable = static_cast<const void* const*>(handles.find(kOutOfMemoryVtable));
  oom.type = handles.find(kOutOfMemoryType);
  return oom;
}

// How an out-of-memory failure reaches PyTorch (the values are rrmm_torch_shim_configure's).
enum class Mode : int { kOutOfMemoryError = 0, kBadAlloc = 1, kNull = 2 };

struct Plan {
  Mode mode = Mode::kNull;
  Runtime runtime;
  OutOfMemoryError oom;
};

struct State {
  std::mutex lock;
  std::size_t tested_vtable_bytes = 0;  // 0: the PyTorch version was not tested (or not given)
  bool found = false;                   // a runtime was found: the plan is kept
  bool said_missing = false;
  bool said_mismatch = false;
  Plan plan;
};

State& state() {
  static State* s = new State();  // never destroyed: used until the process ends
  return *s;
}

// Looks the plan up; the caller holds the lock.
Plan resolve(State& s) {
  Plan plan;
  Handles handles = loaded_torch_libraries();
  if (!handles.any()) return plan;
  plan.runtime = find_runtime(handles);
  if (!plan.runtime.usable()) return plan;
  plan.mode = Mode::kBadAlloc;
  if (s.tested_vtable_bytes == 0) return plan;
  OutOfMemoryError oom = find_out_of_memory_error(handles);
  // A PyTorch without its CUDA library (no OutOfMemoryError's symbols) has no use for the hook.
  if (!oom.usable()) return plan;
  const char* mismatch = layout_mismatch(handles, plan.runtime, oom, s.tested_vtable_bytes);
  if (mismatch != nullptr) {
    if (!s.said_mismatch) {
      std::fprintf(stderr,
                   "rrmm: the loaded PyTorch's c10::OutOfMemoryError is not laid out as in the "
                   "PyTorch versions rrmm was tested with (%s); the allocator hook reports out "
                   "of memory as a std::bad_alloc (RuntimeError) instead\n",
                   mismatch);
      s.said_mismatch = true;
    }
    return plan;
  }
  plan.oom = oom;
  // Thrown as the type_info its vtable names (the copy PyTorch's objects carry).
  plan.oom.type = const_cast<void*>(oom.vtable[1]);
  plan.mode = Mode::kOutOfMemoryError;
  return plan;
}

// The plan for a failure now: looked up until a runtime is found (PyTorch may be imported after
// rrmm), then kept. Allocation failures are rare, so the lookups cost nothing that matters.
Plan current_plan() {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.lock);
  if (!s.found) {
    s.plan = resolve(s);
    s.found = s.plan.mode != Mode::kNull;
  }
  return s.plan;
}

// Room for a c10::Error of any tested PyTorch release (well under 1 KiB).
constexpr std::size_t kErrorObjectBytes = 1024;

// The exception object's destructor, as __cxa_throw wants it: the complete-object destructor,
// the first virtual slot of the object's vtable.
void destroy_by_vtable(void* object) {
  const void* const* vptr = *static_cast<const void* const* const*>(object);
  reinterpret_cast<Destructor>(const_cast<void*>(vptr[0]))(object);
}

[[noreturn]] void throw_out_of_memory_error(const Plan& plan, const char* text) {
  const Runtime& runtime = plan.runtime;
  std::size_t length = std::strlen(text);
  LibstdcxxString message{};
  message.data = static_cast<char*>(runtime.operator_new(length + 1));
  std::memcpy(message.data, text, length + 1);
  message.length = length;
  message.capacity = length;
  void* object = runtime.allocate_exception(kErrorObjectBytes);
  std::memset(object, 0, kErrorObjectBytes);
  plan.oom.construct(object, c10::SourceLocation{"rrmm_torch_allocate", "rrmm", 0}, &message);
  // The caller's half of passing the string by value: destroy the (moved-from) temporary.
  if (message.data != message.local) runtime.operator_delete(message.data);
  *static_cast<const void**>(object) = plan.oom.vtable + 2;
  runtime.throw_exception(object, plan.oom.type, destroy_by_vtable);
  std::abort();  // __cxa_throw does not return
}

// rrmm::out_of_memory: a std::bad_alloc (one vptr) with rrmm's message, laid out by hand for
// PyTorch's runtime. Its type_info derives from the runtime's std::bad_alloc; its vtable is the
// one the Itanium ABI gives std::exception's classes: offset to top, type_info, the complete and
// the deleting destructor, what().
struct BadAlloc {
  const void* vptr;
  char* message;  // from std::malloc, freed by the destructor
};

void bad_alloc_destroy(void* self) {
  std::free(static_cast<BadAlloc*>(self)->message);
  static_cast<BadAlloc*>(self)->message = nullptr;
}

// The deleting destructor: an exception object is never deleted (the runtime frees it after the
// complete destructor), so this only destroys.
void bad_alloc_delete(void* self) { bad_alloc_destroy(self); }

const char* bad_alloc_what(const void* self) {
  const char* message = static_cast<const BadAlloc*>(self)->message;
  return message != nullptr ? message : "rrmm: out of memory";
}

SiClassTypeInfo g_bad_alloc_type{nullptr, "N4rrmm13out_of_memoryE", nullptr};
const void* g_bad_alloc_vtable[5] = {nullptr, &g_bad_alloc_type,
                                     reinterpret_cast<const void*>(&bad_alloc_destroy),
                                     reinterpret_cast<const void*>(&bad_alloc_delete),
                                     reinterpret_cast<const void*>(&bad_alloc_what)};

[[noreturn]] void throw_bad_alloc(const Runtime& runtime, const char* text) {
  {
    // Filled once (a process has one PyTorch runtime); every throw passes this lock first, so the
    // runtime reads the type_info after it is filled.
    static std::mutex lock;
    std::lock_guard<std::mutex> guard(lock);
    if (g_bad_alloc_type.vptr == nullptr) {
      g_bad_alloc_type.vptr = runtime.si_class_type_info_vtable + 2;
      g_bad_alloc_type.base = runtime.bad_alloc_type;
    }
  }
  auto* object = static_cast<BadAlloc*>(runtime.allocate_exception(sizeof(BadAlloc)));
  object->vptr = &g_bad_alloc_vtable[2];
  object->message = strdup(text);  // null on failure: what() then says "rrmm: out of memory"
  runtime.throw_exception(object, &g_bad_alloc_type, bad_alloc_destroy);
  std::abort();  // __cxa_throw does not return
}

void say_missing_once(const char* text) {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.lock);
  if (s.said_missing) return;
  s.said_missing = true;
  std::fprintf(stderr,
               "rrmm: rrmm_torch_allocate failed, and no PyTorch C++ runtime is loaded in this "
               "process to throw with (libc10.so and its libstdc++ were not found); the "
               "allocator returns null for this and later failures (said once): %s\n",
               text);
}

}  // namespace

extern "C" {

// Called by the Python hook at set-up (after importing PyTorch): `tested_vtable_bytes` is the
// size of c10::Error's vtable in the tested PyTorch version that is loaded, or 0 for a version
// rrmm was not tested with. Looks the loaded PyTorch up again and returns how a failure will
// reach PyTorch: 0 c10::OutOfMemoryError, 1 rrmm::out_of_memory (a std::bad_alloc), 2 a null
// pointer (no PyTorch runtime loaded).
int rrmm_torch_shim_configure(std::size_t tested_vtable_bytes) {
  State& s = state();
  std::lock_guard<std::mutex> guard(s.lock);
  s.tested_vtable_bytes = tested_vtable_bytes;
  s.plan = resolve(s);
  s.found = s.plan.mode != Mode::kNull;
  return static_cast<int>(s.plan.mode);
}

// Throws PyTorch's c10::OutOfMemoryError or rrmm::out_of_memory through PyTorch's C++ runtime,
// with a copy of `message` (NUL-terminated, may be null); returns only when no PyTorch runtime
// is loaded (said once on standard error), and the caller then returns null.
void rrmm_torch_raise_out_of_memory(const char* message) {
  const char* text = message ? message : "rrmm: out of memory";
  Plan plan = current_plan();
  switch (plan.mode) {
    case Mode::kOutOfMemoryError:
      throw_out_of_memory_error(plan, text);
    case Mode::kBadAlloc:
      throw_bad_alloc(plan.runtime, text);
    case Mode::kNull:
      break;
  }
  say_missing_once(text);
}

// For rrmm's own Rust tests, which run without PyTorch: also search this already-loaded library
// (e.g. "libstdc++.so.6") for the runtime; `library` must outlive the process's allocations.
void rrmm_torch_shim_search_also(const char* library) { g_test_library.store(library); }

}  // extern "C"
