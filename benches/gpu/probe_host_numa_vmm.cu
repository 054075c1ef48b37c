// Probe for issue 37's last item (reused host-tier data promoted with its addresses kept): can an
// expandable pool's pages be host memory the driver maps under the pool's own addresses
// (cuMemCreate with a host NUMA location), read in place by the GPU over the link, and later
// moved to device memory under the same addresses (copy through a second mapping, then remap)?
//
//   nvcc -O2 -arch=sm_90 -o /tmp/probe benches/gpu/probe_host_numa_vmm.cu -lcuda
//   /tmp/probe [GiB=8] [chunk MiB=512]
//
// Prints one JSON line: how fast the driver makes and maps host-NUMA pages, the GPU writing and
// reading them in place, the promotion (copy + remap) per GiB, a read after it, and whether every
// value survived.
#include <cuda.h>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_common.h"

__global__ void fill(unsigned long long* p, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    p[i] = i * 2654435761ULL + 7;
}

__global__ void sum(const unsigned long long* p, size_t n, unsigned long long* out) {
  unsigned long long acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    acc += p[i];
  atomicAdd(out, acc);
}

int main(int argc, char** argv) {
  size_t gib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 8;
  size_t chunk_mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 512;
  size_t bytes = gib << 30, chunk = chunk_mib << 20, n = bytes / 8;
  cudaSetDevice(0);
  cudaFree(0);  // the primary context, current for the driver calls below
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  int numa = -1;
  CK(cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev));
  if (numa < 0) numa = 0;

  CUmemAllocationProp host{}, device{};
  host.type = device.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  host.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
  host.location.id = numa;
  device.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  device.location.id = 0;
  size_t gran = 0, dgran = 0;
  CK(cuMemGetAllocationGranularity(&gran, &host, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  CK(cuMemGetAllocationGranularity(&dgran, &device, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  if (chunk % gran || chunk % dgran) {
    std::printf("{\"error\": \"chunk not a multiple of the granularity\", \"gran\": %zu}\n", gran);
    return 1;
  }
  CUdeviceptr base = 0, temp = 0;
  CK(cuMemAddressReserve(&base, bytes, 0, 0, 0));
  CK(cuMemAddressReserve(&temp, chunk, 0, 0, 0));
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = 0;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

  size_t chunks = bytes / chunk;
  std::vector<CUmemGenericAllocationHandle> handles(chunks);
  double t0 = now();
  for (size_t i = 0; i < chunks; ++i) {
    CK(cuMemCreate(&handles[i], chunk, &host, 0));
    CK(cuMemMap(base + i * chunk, chunk, 0, handles[i], 0));
    CK(cuMemSetAccess(base + i * chunk, chunk, &access, 1));
  }
  double make_s = now() - t0;

  unsigned long long* out = nullptr;
  cudaMalloc(&out, 8);
  fill<<<1, 1>>>(out, 1);  // load the kernels before anything is timed
  sum<<<1, 1>>>(out, 0, out);
  cudaDeviceSynchronize();
  auto* p = reinterpret_cast<unsigned long long*>(base);
  t0 = now();
  fill<<<1024, 256>>>(p, n);
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::printf("{\"error\": \"fill over host-NUMA pages failed\"}\n");
    return 1;
  }
  double write_s = now() - t0;
  cudaMemset(out, 0, 8);
  t0 = now();
  sum<<<1024, 256>>>(p, n, out);
  cudaDeviceSynchronize();
  double read_s = now() - t0;
  unsigned long long before = 0, after = 0;
  cudaMemcpy(&before, out, 8, cudaMemcpyDeviceToHost);

  // Promotion: each chunk copied into device memory mapped at a second address, then the device
  // memory mapped under the pool's address in place of the host pages.
  t0 = now();
  double copy_s = 0;
  for (size_t i = 0; i < chunks; ++i) {
    CUmemGenericAllocationHandle d;
    CK(cuMemCreate(&d, chunk, &device, 0));
    CK(cuMemMap(temp, chunk, 0, d, 0));
    CK(cuMemSetAccess(temp, chunk, &access, 1));
    double c0 = now();
    CK(cuMemcpyDtoD(temp, base + i * chunk, chunk));
    CK(cuCtxSynchronize());
    copy_s += now() - c0;
    CK(cuMemUnmap(temp, chunk));
    CK(cuMemUnmap(base + i * chunk, chunk));
    CK(cuMemMap(base + i * chunk, chunk, 0, d, 0));
    CK(cuMemSetAccess(base + i * chunk, chunk, &access, 1));
    CK(cuMemRelease(d));  // the mapping holds it
    CK(cuMemRelease(handles[i]));
  }
  double promote_s = now() - t0;
  cudaMemset(out, 0, 8);
  t0 = now();
  sum<<<1024, 256>>>(p, n, out);
  cudaDeviceSynchronize();
  double read_after_s = now() - t0;
  cudaMemcpy(&after, out, 8, cudaMemcpyDeviceToHost);
  double g = (double)bytes / 1e9;
  std::printf(
      "{\"gib\": %zu, \"chunk_mib\": %zu, \"numa\": %d, \"host_granularity\": %zu, "
      "\"make_map_s\": %.3f, \"make_map_gbps\": %.1f, \"gpu_write_in_place_gbps\": %.1f, "
      "\"gpu_read_in_place_gbps\": %.1f, \"promote_s\": %.3f, \"promote_gbps\": %.1f, "
      "\"promote_copy_gbps\": %.1f, \"read_after_promotion_gbps\": %.1f, \"equal\": %s}\n",
      gib, chunk_mib, numa, gran, make_s, g / make_s, g / write_s, g / read_s, promote_s,
      g / promote_s, g / copy_s, g / read_after_s, before == after ? "true" : "false");
  return 0;
}
