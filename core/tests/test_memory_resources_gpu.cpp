// The resource conformance suite on pinned host and device memory (exits 77
// without a GPU), and the device's out-of-memory message.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

#include "cuda_test_support.h"
#include "megalith/memory/device_resource.h"
#include "megalith/memory/limiting_adaptor.h"
#include "megalith/memory/pinned_host_resource.h"
#include "megalith/memory/pool_resource.h"
#include "memory_conformance.h"

namespace mm = megalith::memory;
using megalith_cuda_test::require_gpu;
using megalith_memory_test::Copy;
using megalith_memory_test::host_copy;
using megalith_memory_test::run_conformance;

namespace {
constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kHuge = std::size_t{1} << 50;  // 1 PiB: no machine has it
Copy cuda_copy() {
  return [](void* d, const void* s, std::size_t n) {
    CUDA_OK(cudaMemcpy(d, s, n, cudaMemcpyDefault));
  };
}
std::shared_ptr<mm::Resource> device0() { return std::make_shared<mm::DeviceResource>(0); }
}  // namespace

TEST(pinned_conforms) {
  require_gpu();
  run_conformance({"pinned_host",
                   [] { return std::make_shared<mm::PinnedHostResource>(); },
                   host_copy(),
                   host_copy(),
                   kHuge,
                   {"pinned_host", "1.0 PiB"}});
}

TEST(large_pinned_blocks_are_registered_huge_page_memory) {
  require_gpu();
  mm::PinnedHostResource res;
  const std::size_t n = 5 * (std::size_t{2} << 20) + 4099;  // bytes; not a page multiple
  auto* host = static_cast<unsigned char*>(res.allocate(n, 256));
  CHECK(reinterpret_cast<std::uintptr_t>(host) % (std::size_t{2} << 20) == 0);
  cudaPointerAttributes attr{};
  CUDA_OK(cudaPointerGetAttributes(&attr, host));
  CHECK(attr.type == cudaMemoryTypeHost);  // page-locked, known to the runtime
  std::mt19937 rng(std::random_device{}());
  std::vector<unsigned char> want(n);
  for (auto& b : want) b = static_cast<unsigned char>(rng());
  std::copy(want.begin(), want.end(), host);
  void* dev = nullptr;
  CUDA_OK(cudaMalloc(&dev, n));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  CUDA_OK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  std::fill(host, host + n, 0);
  CUDA_OK(cudaMemcpyAsync(host, dev, n, cudaMemcpyDeviceToHost, stream));
  CUDA_OK(cudaStreamSynchronize(stream));
  CHECK(std::equal(want.begin(), want.end(), host));
  CUDA_OK(cudaStreamDestroy(stream));
  CUDA_OK(cudaFree(dev));
  res.deallocate(host, n, 256);
  void* small = res.allocate(4096, 256);  // small blocks: cudaHostAlloc as before
  CUDA_OK(cudaPointerGetAttributes(&attr, small));
  CHECK(attr.type == cudaMemoryTypeHost);
  res.deallocate(small, 4096, 256);
}

TEST(device_conforms) {
  require_gpu();
  run_conformance({"device(0)",
                   device0,
                   cuda_copy(),
                   cuda_copy(),
                   kHuge,
                   {"device(0)", "device cuda:0", "cudaMalloc failed"}});
}

TEST(pool_device_conforms) {
  require_gpu();
  run_conformance({"pool(device(0))",
                   [] { return std::make_shared<mm::PoolResource>(device0(), 8 * MiB); },
                   cuda_copy(),
                   cuda_copy(),
                   kHuge,
                   {"pool(device(0))", "upstream:"}});
}

TEST(limiting_device_conforms) {
  require_gpu();
  run_conformance({"limit(device(0))",
                   [] { return std::make_shared<mm::LimitingAdaptor>(device0(), 256 * MiB); },
                   cuda_copy(),
                   cuda_copy(),
                   256 * MiB + 1,
                   {"limit 256.0 MiB"}});
}

TEST(device_out_of_memory_names_free_bytes) {
  require_gpu();
  std::size_t free_bytes = 0, total = 0;
  mm::device_memory_info(0, &free_bytes, &total);
  CHECK(free_bytes > 0 && free_bytes <= total);
  mm::DeviceResource r(0);
  try {
    r.allocate(total + MiB);
    CHECK(false);
  } catch (const megalith::out_of_memory& e) {
    CHECK(megalith_memory_test::contains(e.what(), "free"));
    CHECK(megalith_memory_test::contains(e.what(), mm::format_bytes(total)));
  }
  CHECK_THROWS(mm::DeviceResource(megalith::cuda::device_count()), megalith::invalid_argument);
}

MEGALITH_TEST_MAIN()
