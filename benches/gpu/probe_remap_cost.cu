// Issue 48's promotion profile: what each driver call of a promotion costs with 128 MiB pages
// (an any_size pool's page), so the time of moving spilled pages back to the device can be
// split into its calls. For N pages (default 64, 8 GiB) of each kind (device, host NUMA):
//   create   cuMemCreate
//   map      cuMemMap at a reserved address
//   access   cuMemSetAccess, one call per page, and one call over the whole run
//   unmap    cuMemUnmap, one call per page, and one call over a run of mappings (whether the
//            driver takes a range that spans several mappings)
//   release  cuMemRelease
// and the copy host page -> device page over the link (cuMemcpyAsync between the two mapped
// ranges), 8 pages at a time.
//
//   nvcc -O2 -arch=sm_90 -o /tmp/remap benches/gpu/probe_remap_cost.cu -lcuda
//   /tmp/remap [pages = 64]
//
// One JSON line per measure: {"kind", "call", "per", "pages", "s", "ms_per_page"}.
#include <cuda.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "probe_common.h"

static const size_t PAGE = 128ull << 20;

static void report(const char* kind, const char* call, const char* per, size_t pages, double s) {
  std::printf(
      "{\"kind\": \"%s\", \"call\": \"%s\", \"per\": \"%s\", \"pages\": %zu, \"s\": %.4f, "
      "\"ms_per_page\": %.3f}\n",
      kind, call, per, pages, s, s * 1e3 / pages);
  std::fflush(stdout);
}

static CUmemAllocationProp prop_of(bool host, CUdevice dev) {
  CUmemAllocationProp p = {};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  if (host) {
    p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA;
    int numa = 0;
    cuDeviceGetAttribute(&numa, CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID, dev);
    p.location.id = numa < 0 ? 0 : numa;
  } else {
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = (int)dev;
  }
  return p;
}

struct Run {
  CUdeviceptr base;
  std::vector<CUmemGenericAllocationHandle> handles;
};

// Creates, maps and gives access to `n` pages of `kind`, timing each call kind; per-page access
// when `access_per_page`, else one call over the run.
static Run make_run(const char* kind, bool host, size_t n, CUdevice dev, bool access_per_page) {
  CUmemAllocationProp prop = prop_of(host, dev);
  Run r;
  CK(cuMemAddressReserve(&r.base, n * PAGE, PAGE, 0, 0));
  r.handles.resize(n);
  double t0 = now();
  for (size_t i = 0; i < n; ++i) CK(cuMemCreate(&r.handles[i], PAGE, &prop, 0));
  report(kind, "create", "page", n, now() - t0);
  t0 = now();
  for (size_t i = 0; i < n; ++i) CK(cuMemMap(r.base + i * PAGE, PAGE, 0, r.handles[i], 0));
  report(kind, "map", "page", n, now() - t0);
  CUmemAccessDesc acc = {};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = (int)dev;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  t0 = now();
  if (access_per_page) {
    for (size_t i = 0; i < n; ++i) CK(cuMemSetAccess(r.base + i * PAGE, PAGE, &acc, 1));
    report(kind, "access", "page", n, now() - t0);
  } else {
    CK(cuMemSetAccess(r.base, n * PAGE, &acc, 1));
    report(kind, "access", "run", n, now() - t0);
  }
  return r;
}

static void unmap_run(const char* kind, Run& r, bool per_page) {
  size_t n = r.handles.size();
  double t0 = now();
  if (per_page) {
    for (size_t i = 0; i < n; ++i) CK(cuMemUnmap(r.base + i * PAGE, PAGE));
    report(kind, "unmap", "page", n, now() - t0);
  } else {
    CUresult res = cuMemUnmap(r.base, n * PAGE);
    if (res != CUDA_SUCCESS) {
      std::printf("{\"kind\": \"%s\", \"call\": \"unmap\", \"per\": \"run\", \"refused\": %d}\n",
                  kind, (int)res);
      for (size_t i = 0; i < n; ++i) CK(cuMemUnmap(r.base + i * PAGE, PAGE));
    } else {
      report(kind, "unmap", "run", n, now() - t0);
    }
  }
  t0 = now();
  for (auto h : r.handles) CK(cuMemRelease(h));
  report(kind, "release", "page", n, now() - t0);
  CK(cuMemAddressFree(r.base, n * PAGE));
}

int main(int argc, char** argv) {
  size_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 64;
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  CUstream s;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  for (int round = 0; round < 2; ++round) {
    bool per_page = round == 0;
    Run d = make_run("device", false, n, dev, per_page);
    Run h = make_run("host", true, n, dev, per_page);
    // Copies host -> device, 8 pages per batch, waited for at the end.
    double t0 = now();
    for (size_t i = 0; i < n; ++i) CK(cuMemcpyAsync(d.base + i * PAGE, h.base + i * PAGE, PAGE, s));
    double queued = now() - t0;
    CK(cuStreamSynchronize(s));
    double s_copy = now() - t0;
    report("host->device", "copy", "page", n, s_copy);
    report("host->device", "copy_queue", "page", n, queued);
    std::printf("{\"copy_gbps\": %.2f}\n", n * PAGE / 1e9 / s_copy);
    unmap_run("device", d, per_page);
    unmap_run("host", h, per_page);
  }
  // Reservation and its free (a promotion's scratch range), 1 GiB.
  double t0 = now();
  for (int i = 0; i < 64; ++i) {
    CUdeviceptr p;
    CK(cuMemAddressReserve(&p, 8 * PAGE, PAGE, 0, 0));
    CK(cuMemAddressFree(p, 8 * PAGE));
  }
  report("address", "reserve+free", "GiB", 64, now() - t0);
  return 0;
}
