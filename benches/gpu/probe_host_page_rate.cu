// Issue 48's profile: what limits the making of host pages that a GPU reads in place.
// For each way of making pinned host memory, the rate (GB/s) by the size of each call, the
// number of threads making at once, the NUMA node, and with the GPU busy writing its own memory
// meanwhile (the device still has room while the pages are made):
//   vmm      cuMemCreate of host-NUMA pages + cuMemMap + cuMemSetAccess (what a spilling
//            expandable pool maps under its own addresses; promotable in place)
//   touch    mmap + first touch by the threads (the kernel's making of pages, no pinning)
//   register cuMemHostRegister of memory already touched (the pinning alone)
//   hostalloc cuMemHostAlloc (the driver makes, touches and pins)
//
//   nvcc -O2 -arch=sm_90 -o /tmp/rate benches/gpu/probe_host_page_rate.cu -lcuda -lpthread
//   /tmp/rate [GiB per case = 8] [host: only the touch, register and hostalloc ways | device: device pages by call size and threads]
//
// One JSON line per case: {"way", "chunk_mib", "threads", "numa", "busy_gpu", "gib", "s",
// "gbps"}. Every case gives its memory back before the next; the cases run in the order printed
// (the first pays the host's first making of pages; later ones reuse pages the kernel freed).
#include <cuda.h>
#include <cuda_runtime.h>
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "probe_common.h"

static CUcontext ctx;
static CUdevice dev;

__global__ void spin_write(unsigned long long* p, size_t n, int rounds) {
  for (int r = 0; r < rounds; ++r)
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
      p[i] = i + r;
}

static void report(const char* way, size_t chunk, int threads, int numa, bool busy, size_t bytes,
                   double s) {
  std::printf(
      "{\"way\": \"%s\", \"chunk_mib\": %zu, \"threads\": %d, \"numa\": %d, \"busy_gpu\": %s, "
      "\"gib\": %.1f, \"s\": %.3f, \"gbps\": %.2f}\n",
      way, chunk >> 20, threads, numa, busy ? "true" : "false", bytes / double(1 << 30), s,
      bytes / 1e9 / s);
  std::fflush(stdout);
}

// Runs f(i) for i in [0, n) on `threads` threads (each takes the next index); returns seconds.
template <class F>
static double parallel(size_t n, int threads, F f) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> ts;
  double t0 = now();
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&] {
      CK(cuCtxSetCurrent(ctx));
      for (size_t i; (i = next.fetch_add(1)) < n;) f(i);
    });
  for (auto& t : ts) t.join();
  return now() - t0;
}

// numa -2: device memory (the pool's own pages while the device has room), for comparison.
static void vmm_case(size_t bytes, size_t chunk, int threads, int numa, bool busy) {
  CUmemAllocationProp host{};
  host.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location.type = numa == -2 ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST_NUMA;
  host.location.id = numa == -2 ? 0 : numa;
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  size_t chunks = bytes / chunk;
  CUdeviceptr base = 0;
  CK(cuMemAddressReserve(&base, bytes, 0, 0, 0));
  std::vector<CUmemGenericAllocationHandle> h(chunks);
  unsigned long long* work = nullptr;
  size_t work_n = (size_t(4) << 30) / 8;
  if (busy) {
    cudaMalloc(&work, work_n * 8);
    spin_write<<<1024, 256>>>(work, work_n, 400);  // the GPU busy for the whole case
  }
  double s = parallel(chunks, threads, [&](size_t i) {
    CK(cuMemCreate(&h[i], chunk, &host, 0));
    CK(cuMemMap(base + i * chunk, chunk, 0, h[i], 0));
    CK(cuMemSetAccess(base + i * chunk, chunk, &access, 1));
  });
  report(numa == -2 ? "vmm_device" : "vmm", chunk, threads, numa, busy, bytes, s);
  if (busy) {
    cudaDeviceSynchronize();
    cudaFree(work);
  }
  for (size_t i = 0; i < chunks; ++i) {
    CK(cuMemUnmap(base + i * chunk, chunk));
    CK(cuMemRelease(h[i]));
  }
  CK(cuMemAddressFree(base, bytes));
}

static void touch_register_case(size_t bytes, size_t chunk, int threads, bool huge) {
  char* p = static_cast<char*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (p == MAP_FAILED) return;
  if (huge) madvise(p, bytes, MADV_HUGEPAGE);
  size_t chunks = bytes / chunk;
  double s = parallel(chunks, threads, [&](size_t i) {
    for (size_t o = 0; o < chunk; o += 4096) p[i * chunk + o] = 1;
  });
  report(huge ? "touch_thp" : "touch", chunk, threads, -1, false, bytes, s);
  s = parallel(chunks, threads, [&](size_t i) {
    CK(cuMemHostRegister(p + i * chunk, chunk, CU_MEMHOSTREGISTER_DEVICEMAP));
  });
  report(huge ? "register_thp" : "register", chunk, threads, -1, false, bytes, s);
  for (size_t i = 0; i < chunks; ++i) CK(cuMemHostUnregister(p + i * chunk));
  munmap(p, bytes);
}

static void hostalloc_case(size_t bytes, size_t chunk, int threads) {
  size_t chunks = bytes / chunk;
  std::vector<void*> ps(chunks);
  double s = parallel(chunks, threads, [&](size_t i) {
    CK(cuMemHostAlloc(&ps[i], chunk, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  });
  report("hostalloc", chunk, threads, -1, false, bytes, s);
  for (void* q : ps) CK(cuMemFreeHost(q));
}

int main(int argc, char** argv) {
  size_t gib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8;
  size_t bytes = gib << 30;
  cudaSetDevice(0);
  cudaFree(0);
  CK(cuInit(0));
  CK(cuDeviceGet(&dev, 0));
  CK(cuCtxGetCurrent(&ctx));
  int numa = -1;
  CK(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev));
  if (numa < 0) numa = 0;
  const size_t M = 1 << 20;
  bool only_host = argc > 2 && std::strcmp(argv[2], "host") == 0;
  if (argc > 2 && std::strcmp(argv[2], "device") == 0) {
    // Device pages: does a larger call or more threads make them faster?
    for (size_t chunk : {2 * M, 32 * M, 128 * M, 512 * M, 2048 * M})
      for (int t : {1, 4}) vmm_case(bytes, chunk, t, -2, false);
    return 0;
  }
  if (!only_host) {
  // The first case makes pages the host has never made (first touch of a fresh machine).
  vmm_case(bytes, 512 * M, 1, numa, false);
  for (size_t chunk : {2 * M, 32 * M, 512 * M, 2048 * M})
    for (int t : {1, 2, 4, 8, 16}) {
      if (chunk == 2 * M && t > 4) continue;
      vmm_case(bytes, chunk, t, numa, false);
    }
  vmm_case(bytes, 512 * M, 8, numa, true);
  vmm_case(bytes, 512 * M, 1, numa, true);
  int other = numa == 0 ? 1 : 0;
  CUmemAllocationProp probe{};
  probe.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  probe.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  probe.location.id = other;
  {
  size_t g = 0;
  CUmemGenericAllocationHandle h = 0;
  // A second node only where the driver makes a page there (one node: cuMemCreate refuses).
  if (cuMemGetAllocationGranularity(&g, &probe, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
          CUDA_SUCCESS &&
      cuMemCreate(&h, g, &probe, 0) == CUDA_SUCCESS) {
    cuMemRelease(h);
    vmm_case(bytes, 512 * M, 1, other, false);
    vmm_case(bytes, 512 * M, 8, other, false);
  } else {
    std::printf("{\"note\": \"no second NUMA node\"}\n");
  }
  }
  }
  for (int t : {1, 4, 16}) touch_register_case(bytes, 512 * M, t, false);
  touch_register_case(bytes, 512 * M, 16, true);
  for (int t : {1, 8}) hostalloc_case(bytes, 512 * M, t);
  return 0;
}
