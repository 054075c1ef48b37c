// W1 reference: replays a compiled trace against RMM's C++ resources and prints one JSON line
// per resource. Built on the GPU machine by scripts/gpu_run.sh against the librmm wheel:
//   nvcc -std=c++20 -O2 rmm_replay.cu -I$LIBRMM/include -I$LIBRMM/include/rapids
//        -I$LOGGER/include -L$LIBRMM/lib64 -lrmm -L$LOGGER/lib64 -lrapids_logger
// Input (from benches/gpu/compile_trace.py): lines "a SLOT SIZE" or "f SLOT SIZE".
#include <rmm/mr/arena_memory_resource.hpp>
#include <rmm/mr/binning_memory_resource.hpp>
#include <rmm/mr/cuda_async_memory_resource.hpp>
#include <rmm/mr/cuda_memory_resource.hpp>
#include <rmm/mr/pool_memory_resource.hpp>
#include <rmm/aligned.hpp>
#include <rmm/cuda_device.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

struct Op {
  bool alloc;
  std::size_t slot;
  std::size_t size;
};

// The stream the replay runs on: 0 (what RMM's default stream is), or, with a fifth argument,
// the legacy default stream ("legacy") or the per-thread default stream ("ptds") named
// explicitly.
static cudaStream_t replay_stream = cudaStream_t{0};

template <typename MR>
void replay(char const* trace, char const* name, MR& mr, std::vector<Op> const& ops,
            std::size_t slots, int reps)
{
  std::vector<void*> ptrs(slots, nullptr);
  std::vector<std::size_t> sizes(slots, 0);
  cuda::stream_ref stream{replay_stream};
  std::vector<double> times;
  long failures = 0;
  for (int r = 0; r < reps; ++r) {
    cudaDeviceSynchronize();
    auto start = std::chrono::steady_clock::now();
    for (auto const& op : ops) {
      if (op.alloc) {
        try {
          ptrs[op.slot] = mr.allocate(stream, op.size, rmm::CUDA_ALLOCATION_ALIGNMENT);
          sizes[op.slot] = op.size;
        } catch (std::exception const&) {
          ptrs[op.slot] = nullptr;
          ++failures;
        }
      } else if (ptrs[op.slot] != nullptr) {
        mr.deallocate(stream, ptrs[op.slot], op.size, rmm::CUDA_ALLOCATION_ALIGNMENT);
        ptrs[op.slot] = nullptr;
      }
    }
    cudaDeviceSynchronize();
    auto stop = std::chrono::steady_clock::now();
    times.push_back(std::chrono::duration<double, std::nano>(stop - start).count());
    for (std::size_t i = 0; i < slots; ++i) {
      if (ptrs[i] != nullptr) { mr.deallocate(stream, ptrs[i], sizes[i], rmm::CUDA_ALLOCATION_ALIGNMENT); ptrs[i] = nullptr; }
    }
  }
  std::sort(times.begin(), times.end());
  double median = times[times.size() / 2];
  std::printf("{\"impl\": \"rmm\", \"trace\": \"%s\", \"resource\": \"%s\", \"events\": %zu, "
              "\"ns_per_event\": %.1f, \"failures\": %ld}\n",
              trace, name, ops.size(), median / ops.size(), failures);
  std::fflush(stdout);
}

int main(int argc, char** argv)
{
  if (argc < 4) {
    std::cerr << "usage: rmm_replay TRACE_NAME COMPILED_FILE RESOURCE[,RESOURCE...] [REPS]\n";
    return 2;
  }
  std::string trace = argv[1];
  std::ifstream in(argv[2]);
  std::vector<Op> ops;
  std::size_t slots = 0;
  char action;
  std::size_t slot, size;
  while (in >> action >> slot >> size) {
    ops.push_back({action == 'a', slot, size});
    if (slot + 1 > slots) slots = slot + 1;
  }
  std::string list = argv[3];
  int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  if (argc > 5) {
    std::string which = argv[5];
    replay_stream = which == "ptds" ? cudaStreamPerThread : which == "legacy" ? cudaStreamLegacy
                                                                              : cudaStream_t{0};
  }
  std::size_t pos = 0;
  while (pos <= list.size()) {
    std::size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    std::string name = list.substr(pos, comma - pos);
    pos = comma + 1;
    auto half = rmm::align_down(rmm::available_device_memory().first / 2, std::size_t{256});
    if (name == "pool") {
      rmm::mr::pool_memory_resource mr{rmm::mr::cuda_memory_resource{}, half};
      replay(trace.c_str(), "pool", mr, ops, slots, reps);
    } else if (name == "binning") {
      rmm::mr::pool_memory_resource pool{rmm::mr::cuda_memory_resource{}, half};
      rmm::mr::binning_memory_resource mr{pool, 18, 22};
      replay(trace.c_str(), "binning", mr, ops, slots, reps);
    } else if (name == "arena") {
      rmm::mr::arena_memory_resource mr{rmm::mr::cuda_memory_resource{}, half};
      replay(trace.c_str(), "arena", mr, ops, slots, reps);
    } else if (name == "cuda_async") {
      rmm::mr::cuda_async_memory_resource mr{};
      replay(trace.c_str(), "cuda_async", mr, ops, slots, reps);
    } else if (name == "cuda") {
      rmm::mr::cuda_memory_resource mr{};
      replay(trace.c_str(), "cuda", mr, ops, slots, 1);
    }
  }
  return 0;
}
