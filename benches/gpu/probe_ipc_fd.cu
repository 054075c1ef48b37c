// Issue 49's first question: does this machine's driver export device memory made by
// cuMemCreate as a POSIX file descriptor that another process imports and maps?
// The parent makes 256 MiB (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), fills it, exports
// the fd and passes it to a forked child over a Unix socket (SCM_RIGHTS). The child (its own
// CUDA context, made after the fork) imports it, maps it at its own address, and checks
// every value.
//
//   nvcc -O2 -arch=sm_90 -o /tmp/ipc benches/gpu/probe_ipc_fd.cu -lcuda
//   /tmp/ipc
//
// One JSON line: whether each step worked, the times of the export, import and map, and
// whether the child read every value.
#include <cuda.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

static double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

static const char* err(CUresult r) {
  const char* s = nullptr;
  cuGetErrorString(r, &s);
  return s ? s : "?";
}

static void send_fd(int sock, int fd) {
  char byte = 0;
  iovec io{&byte, 1};
  char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  sendmsg(sock, &msg, 0);
}

static int recv_fd(int sock) {
  char byte = 0;
  iovec io{&byte, 1};
  char ctrl[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &io;
  msg.msg_iovlen = 1;
  msg.msg_control = ctrl;
  msg.msg_controllen = sizeof(ctrl);
  if (recvmsg(sock, &msg, 0) <= 0) return -1;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (!c || c->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(c), sizeof(int));
  return fd;
}

static CUmemAllocationProp props() {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = 0;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

// The child: imports the fd, maps it, checks every 64-bit value against its index; writes a
// JSON fragment to `out`.
static int child(int sock, size_t bytes, int out) {
  char line[512];
  CUresult r = cuInit(0);
  CUdevice dev;
  CUcontext ctx;
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  int fd = recv_fd(sock);
  double t0 = now();
  CUmemGenericAllocationHandle h = 0;
  if (r == CUDA_SUCCESS)
    r = cuMemImportFromShareableHandle(&h, (void*)(uintptr_t)fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  double import_s = now() - t0;
  CUdeviceptr va = 0;
  t0 = now();
  if (r == CUDA_SUCCESS) r = cuMemAddressReserve(&va, bytes, 0, 0, 0);
  if (r == CUDA_SUCCESS) r = cuMemMap(va, bytes, 0, h, 0);
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (r == CUDA_SUCCESS) r = cuMemSetAccess(va, bytes, &a, 1);
  double map_s = now() - t0;
  size_t n = bytes / 8, bad = n;
  if (r == CUDA_SUCCESS) {
    std::vector<unsigned long long> host(n);
    r = cuMemcpyDtoH(host.data(), va, bytes);
    if (r == CUDA_SUCCESS) {
      bad = 0;
      for (size_t i = 0; i < n; ++i) bad += host[i] != i * 2654435761ULL;
    }
  }
  std::snprintf(line, sizeof(line),
                "\"child\": \"%s\", \"import_s\": %.6f, \"map_s\": %.6f, \"wrong_values\": %zu",
                err(r), import_s, map_s, bad);
  if (write(out, line, std::strlen(line)) < 0) return 1;
  return r == CUDA_SUCCESS && bad == 0 ? 0 : 1;
}

int main() {
  const size_t bytes = size_t(256) << 20;
  int sv[2], pipefd[2];
  socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
  if (pipe(pipefd) != 0) return 1;
  pid_t pid = fork();  // before the parent's CUDA context: the child makes its own
  if (pid == 0) {
    close(sv[0]);
    close(pipefd[0]);
    _exit(child(sv[1], bytes, pipefd[1]));
  }
  close(sv[1]);
  close(pipefd[1]);
  CUresult r = cuInit(0);
  CUdevice dev;
  CUcontext ctx;
  if (r == CUDA_SUCCESS) r = cuDeviceGet(&dev, 0);
  if (r == CUDA_SUCCESS) r = cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r == CUDA_SUCCESS) r = cuCtxSetCurrent(ctx);
  int supported = 0;
  if (r == CUDA_SUCCESS)
    cuDeviceGetAttribute(&supported,
                         CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
  CUmemAllocationProp p = props();
  CUmemGenericAllocationHandle h = 0;
  CUresult made = r == CUDA_SUCCESS ? cuMemCreate(&h, bytes, &p, 0) : r;
  CUdeviceptr va = 0;
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = 0;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  CUresult filled = made;
  if (made == CUDA_SUCCESS) {
    filled = cuMemAddressReserve(&va, bytes, 0, 0, 0);
    if (filled == CUDA_SUCCESS) filled = cuMemMap(va, bytes, 0, h, 0);
    if (filled == CUDA_SUCCESS) filled = cuMemSetAccess(va, bytes, &a, 1);
    if (filled == CUDA_SUCCESS) {
      std::vector<unsigned long long> host(bytes / 8);
      for (size_t i = 0; i < host.size(); ++i) host[i] = i * 2654435761ULL;
      filled = cuMemcpyHtoD(va, host.data(), bytes);
    }
  }
  int fd = -1;
  double t0 = now();
  CUresult exported =
      filled == CUDA_SUCCESS
          ? cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)
          : filled;
  double export_s = now() - t0;
  send_fd(sv[0], exported == CUDA_SUCCESS ? fd : -1);
  int status = 0;
  waitpid(pid, &status, 0);
  char child_line[512] = {};
  ssize_t got = read(pipefd[0], child_line, sizeof(child_line) - 1);
  if (got < 0) got = 0;
  std::printf(
      "{\"fd_handles_supported\": %d, \"create\": \"%s\", \"fill\": \"%s\", \"export\": \"%s\", "
      "\"export_s\": %.6f, %s, \"child_exit\": %d}\n",
      supported, err(made), err(filled), err(exported), export_s,
      got ? child_line : "\"child\": \"no answer\"", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
