// The NCCL communicator on a GPU at world size 1: every operation against a
// host reference, stream ordering, groups, abort, and the watchdog timing out
// an operation held back on its stream. Skipped (77) without a GPU or NCCL.

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "harness.h"
#include "megalith/comm/communicator.h"
#include "megalith/comm/nccl.h"
#include "megalith/cuda/device.h"
#include "megalith/error.h"

namespace mc = megalith::comm;
using megalith::DType;

namespace {

void require_gpu_and_nccl() {
  if (megalith::cuda::device_count() == 0) SKIP("no CUDA device: " + megalith::cuda::status());
  if (!mc::nccl_available()) SKIP("NCCL not loadable (pip install nvidia-nccl-cu13)");
}

/// float buffer on the device, filled from / read into host vectors.
struct DeviceFloats {
  explicit DeviceFloats(std::size_t n) : n(n) {
    if (cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<std::size_t>(n, 1) * sizeof(float)) !=
        cudaSuccess) {
      throw megalith::error("cudaMalloc failed");
    }
  }
  ~DeviceFloats() { cudaFree(ptr); }
  void put(const std::vector<float>& v) {
    cudaMemcpy(ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice);
  }
  std::vector<float> get() const {
    std::vector<float> v(n);
    cudaDeviceSynchronize();
    cudaMemcpy(v.data(), ptr, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
  float* ptr = nullptr;
  std::size_t n;
};

std::vector<float> iota(std::size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

mc::Communicator make_comm(const char* name, double timeout_s = 60.0) {
  return mc::Communicator(mc::unique_id(), 1, 0, 0, mc::Options{timeout_s, name});
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(every_op_at_world_size_one) {
  require_gpu_and_nccl();
  mc::Communicator comm = make_comm("t1");
  CHECK(comm.rank() == 0 && comm.size() == 1 && comm.device() == 0 && comm.name() == "t1");
  const std::size_t n = 1001;  // odd on purpose
  DeviceFloats a(n), b(n);
  auto x = iota(n, 1.0f);
  for (mc::ReduceOp op : {mc::ReduceOp::sum, mc::ReduceOp::avg, mc::ReduceOp::max}) {
    a.put(x);
    comm.all_reduce(a.ptr, b.ptr, n, DType::f32, op, nullptr)->synchronize();
    CHECK(b.get() == x);
  }
  comm.all_reduce(a.ptr, a.ptr, n, DType::f32, mc::ReduceOp::sum, nullptr)->synchronize();
  CHECK(a.get() == x);
  b.put(std::vector<float>(n, 0.0f));
  comm.reduce_scatter(a.ptr, b.ptr, n, DType::f32, mc::ReduceOp::sum, nullptr)->synchronize();
  CHECK(b.get() == x);
  b.put(std::vector<float>(n, 0.0f));
  comm.all_gather(a.ptr, b.ptr, n, DType::f32, nullptr)->synchronize();
  CHECK(b.get() == x);
  comm.broadcast(a.ptr, n, DType::f32, 0, nullptr)->synchronize();
  CHECK(a.get() == x);
  b.put(std::vector<float>(n, 0.0f));
  comm.reduce(a.ptr, b.ptr, n, DType::f32, mc::ReduceOp::sum, 0, nullptr)->synchronize();
  CHECK(b.get() == x);
  b.put(std::vector<float>(n, 0.0f));
  comm.all_to_all(a.ptr, b.ptr, n, DType::f32, nullptr)->synchronize();
  CHECK(b.get() == x);

  // Self send/recv must be in one group.
  b.put(std::vector<float>(n, 0.0f));
  comm.group_start();
  auto s = comm.send(a.ptr, n, DType::f32, 0, nullptr);
  auto r = comm.recv(b.ptr, n, DType::f32, 0, nullptr);
  comm.group_end();
  r->synchronize();
  CHECK(s->is_completed());
  CHECK(b.get() == x);
  CHECK_THROWS(comm.send(a.ptr, n, DType::f32, 0, nullptr), megalith::invalid_argument);

  // Uneven all_to_allv at one rank: 7 elements from offset 3 land at offset 10.
  b.put(std::vector<float>(n, 0.0f));
  comm.all_to_allv(a.ptr, {7}, {3}, b.ptr, {7}, {10}, DType::f32, nullptr)->synchronize();
  auto got = b.get();
  for (int i = 0; i < 7; ++i) CHECK(got[10 + i] == x[3 + i]);
  CHECK(got[9] == 0.0f && got[17] == 0.0f);

  auto w = comm.barrier(nullptr);
  w->synchronize();
  CHECK(w->is_completed());
  CHECK(!comm.error().has_value());
}

namespace {
void CUDART_CB pause_20ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(20)); }
}  // namespace

TEST(order_on_a_side_stream_and_wait_on_another) {
  require_gpu_and_nccl();
  mc::Communicator comm = make_comm("streams");
  const std::size_t n = 1 << 20;
  DeviceFloats a(n);
  cudaMemset(a.ptr, 0, n * sizeof(float));
  cudaDeviceSynchronize();
  cudaStream_t side = nullptr;
  CHECK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking) == cudaSuccess);
  // A slow fill on the side stream, then the all_reduce there: it must see the fill.
  cudaLaunchHostFunc(side, pause_20ms, nullptr);
  cudaMemsetAsync(a.ptr, 0x3f, n * sizeof(float), side);
  auto w = comm.all_reduce(a.ptr, a.ptr, n, DType::f32, mc::ReduceOp::sum, side);
  w->wait(nullptr);  // the default stream now waits for the all_reduce, the host does not
  std::vector<float> host(n, 1.0f);
  cudaMemcpyAsync(host.data(), a.ptr, n * sizeof(float), cudaMemcpyDeviceToHost, nullptr);
  cudaStreamSynchronize(nullptr);
  float filled = 0.0f;
  const std::uint32_t bits = 0x3f3f3f3fu;
  std::memcpy(&filled, &bits, sizeof(filled));
  CHECK(host[0] == filled && host[n - 1] == filled);
  CHECK(w->is_completed());
  cudaStreamDestroy(side);
}

TEST(a_group_of_small_all_reduces_completes_at_group_end) {
  require_gpu_and_nccl();
  mc::Communicator comm = make_comm("group");
  DeviceFloats a(64 * 33);
  auto x = iota(64 * 33, 0.5f);
  a.put(x);
  std::vector<mc::Communicator::WorkPtr> works;
  comm.group_start();
  for (int i = 0; i < 64; ++i) {
    works.push_back(comm.all_reduce(a.ptr + 33 * i, a.ptr + 33 * i, 33, DType::f32,
                                    mc::ReduceOp::sum, nullptr));
  }
  CHECK(!works[0]->is_completed());
  CHECK_THROWS(works[0]->synchronize(), megalith::invalid_argument);
  comm.group_end();
  for (auto& w : works) w->synchronize();
  CHECK(a.get() == x);
  CHECK_THROWS(comm.group_end(), megalith::invalid_argument);
}

TEST(abort_fails_the_next_call_naming_the_communicator) {
  require_gpu_and_nccl();
  mc::Communicator comm = make_comm("aborted-dp");
  DeviceFloats a(16);
  comm.all_reduce(a.ptr, a.ptr, 16, DType::f32, mc::ReduceOp::sum, nullptr)->synchronize();
  comm.abort();
  CHECK(comm.error().has_value() && contains(*comm.error(), "'aborted-dp'"));
  try {
    comm.all_reduce(a.ptr, a.ptr, 16, DType::f32, mc::ReduceOp::sum, nullptr);
    CHECK(false);
  } catch (const megalith::error& e) {
    CHECK(contains(e.what(), "'aborted-dp' (rank 0 of 1)"));
  }
}

namespace {
void CUDART_CB hold_stream(void* flag) {
  auto* f = static_cast<std::atomic<bool>*>(flag);
  while (!f->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
}  // namespace

TEST(watchdog_fails_an_op_that_outlives_the_timeout) {
  require_gpu_and_nccl();
  mc::Communicator comm = make_comm("slow", 1.0);
  DeviceFloats a(1024);
  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  std::atomic<bool> release{false};
  cudaLaunchHostFunc(s, hold_stream, &release);  // the all_reduce queues behind this
  auto t0 = std::chrono::steady_clock::now();
  auto w = comm.all_reduce(a.ptr, a.ptr, 1024, DType::f32, mc::ReduceOp::sum, s);
  std::string text;
  try {
    w->synchronize();
  } catch (const megalith::error& e) {
    text = e.what();
  }
  double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  release.store(true);
  std::printf("  after %.2f s: %s\n", waited, text.c_str());
  CHECK(waited < 4.0);
  CHECK(contains(text, "all_reduce on 'slow' (rank 0 of 1, 1024 x float32)"));
  CHECK(contains(text, "did not finish within 1.0 s"));
  CHECK(comm.error().has_value());
  CHECK_THROWS(comm.barrier(nullptr), megalith::error);
  cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
}

MEGALITH_TEST_MAIN()
