// RMM's reference W7 harness, kept in the repository (the GPU machine sees only it), with arena and
// binning added (same workload; build with -DRMM_W7_NO_EXTRA for the original three resources).
// W7 anchors for RMM: (a) threads, each on its own stream, allocating and freeing random small
// sizes from one shared resource; (b) RMM's multi-stream pattern: S streams x K kernels, each
// kernel's buffer allocated on its stream, the kernel spins ~1M clocks, the buffer freed after.
#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>
#include <rmm/cuda_stream_view.hpp>
#ifndef RMM_W7_NO_EXTRA
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#endif
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/resource_ref.hpp>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

using any_res = cuda::mr::any_resource<cuda::mr::device_accessible>;
using clk = std::chrono::steady_clock;

static any_res make(std::string const& name) {
  if (name == "pool") return any_res{rmm::mr::pool_memory_resource{rmm::mr::cuda_memory_resource{}, 8UL << 30}};
  if (name == "cuda_async") return any_res{rmm::mr::cuda_async_memory_resource{}};
  return any_res{rmm::mr::cuda_memory_resource{}};
}

static double threads_run(rmm::device_async_resource_ref mr, int nthreads, int ops) {
  std::vector<std::thread> ts;
  auto t0 = clk::now();
  for (int t = 0; t < nthreads; ++t) {
    ts.emplace_back([&, t] {
      cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      rmm::cuda_stream_view sv{s};
      std::mt19937_64 rng(t + 1);
      std::uniform_int_distribution<std::size_t> sz(256, 1 << 20);
      std::vector<std::pair<void*, std::size_t>> live;
      for (int i = 0; i < ops; ++i) {
        if (live.size() < 64 && (live.empty() || rng() % 2)) {
          auto n = sz(rng); live.emplace_back(mr.allocate(sv, n, 256), n);
        } else {
          auto k = rng() % live.size(); std::swap(live[k], live.back());
          mr.deallocate(sv, live.back().first, live.back().second, 256); live.pop_back();
        }
      }
      for (auto& [p, n] : live) mr.deallocate(sv, p, n, 256);
      cudaStreamSynchronize(s); cudaStreamDestroy(s);
    });
  }
  for (auto& th : ts) th.join();
  return std::chrono::duration<double>(clk::now() - t0).count();
}

__global__ void spin(int64_t* out, long long cycles) {
  long long start = clock64();
  while (clock64() - start < cycles) {}
  if (threadIdx.x == 0) out[0] = start;
}

static double streams_run(rmm::device_async_resource_ref mr, int nstreams, int kernels) {
  std::vector<cudaStream_t> ss(nstreams);
  for (auto& s : ss) cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaDeviceSynchronize();
  auto t0 = clk::now();
  for (int k = 0; k < kernels; ++k) {
    auto s = ss[k % nstreams];
    rmm::cuda_stream_view sv{s};
    void* p = mr.allocate(sv, sizeof(int64_t), 256);
    spin<<<1, 1, 0, s>>>(static_cast<int64_t*>(p), 1000000);
    mr.deallocate(sv, p, sizeof(int64_t), 256);
  }
  cudaDeviceSynchronize();
  double dt = std::chrono::duration<double>(clk::now() - t0).count();
  for (auto& s : ss) cudaStreamDestroy(s);
  return dt;
}

static void run_all(std::string const& name, rmm::device_async_resource_ref mr) {
  int ops = name == "cuda" ? 2000 : 100000;
  for (int t : {1, 2, 4, 8, 16}) {
    threads_run(mr, t, ops / 10);
    std::vector<double> v;
    for (int r = 0; r < 3; ++r) v.push_back(threads_run(mr, t, ops));
    std::sort(v.begin(), v.end());
    std::printf("{\"impl\":\"rmm-cpp\",\"bench\":\"threads\",\"resource\":\"%s\",\"threads\":%d,\"ops_per_thread\":%d,\"median_s\":%.4f,\"mops_per_s\":%.3f}\n",
                name.c_str(), t, ops, v[1], t * ops / v[1] / 1e6);
  }
  for (int s : {1, 2, 4}) {
    streams_run(mr, s, 4);  // warm-up: the resource keeps its memory between runs
    std::vector<double> v;
    for (int r = 0; r < 5; ++r) v.push_back(streams_run(mr, s, 4));
    std::sort(v.begin(), v.end());
    std::printf("{\"impl\":\"rmm-cpp\",\"bench\":\"multi_stream\",\"resource\":\"%s\",\"streams\":%d,\"kernels\":4,\"median_us\":%.1f}\n",
                name.c_str(), s, v[2] * 1e6);
  }
  std::fflush(stdout);
}

int main() {
  cudaFree(nullptr);
  for (std::string name : {"pool", "cuda_async", "cuda"}) {
    auto mr = make(name);
    run_all(name, mr);
  }
#ifndef RMM_W7_NO_EXTRA
  {
    rmm::mr::arena_memory_resource mr{rmm::mr::cuda_memory_resource{}, 8UL << 30};
    run_all("arena", mr);
  }
  {
    rmm::mr::pool_memory_resource pool{rmm::mr::cuda_memory_resource{}, 8UL << 30};
    rmm::mr::binning_memory_resource mr{pool, 18, 22};
    run_all("binning", mr);
  }
#endif
  return 0;
}
