// For rrmm's own Rust tests (src/python/hooks/torch_pluggable.rs): calls rrmm_torch_allocate as PyTorch
// would, catching what it throws. Built with C++ exceptions, apart from the shim
// (csrc/torch_shim.cpp), which has none; only meaningful where the C++ runtime this file is built
// with is the one the shim throws with (`cargo test` builds with the system's g++ and libstdc++).
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>

extern "C" {

// Exported by the Rust side.
void* rrmm_torch_allocate(std::size_t size, int device, void* stream);

// Calls rrmm_torch_allocate, catching what it throws.
// Returns 0 and stores the pointer on success (null included); returns 1 and copies what() into
// `message` (truncated to `capacity` bytes, NUL-terminated) when a std::bad_alloc was thrown;
// returns 3 the same way for any other std::exception (PyTorch's OutOfMemoryError is one);
// returns 2 for anything else. Only meaningful where the shim's C++ runtime is the one thrown
// with (a build with the system's g++, as `cargo test` does).
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
