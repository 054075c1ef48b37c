// What the probes under benches/gpu share: CK (a driver call checked; on failure one JSON line
// naming the call, then exit) and now() (seconds, steady clock).
#pragma once
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                          \
  do {                                                                                 \
    CUresult r_ = (x);                                                                 \
    if (r_ != CUDA_SUCCESS) {                                                          \
      const char* s_ = nullptr;                                                        \
      cuGetErrorString(r_, &s_);                                                       \
      std::printf("{\"error\": \"%s\", \"call\": \"%s\", \"line\": %d}\n", s_ ? s_ : "?", \
                  #x, __LINE__);                                                       \
      std::fflush(stdout);                                                             \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
