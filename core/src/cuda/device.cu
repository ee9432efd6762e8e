// Whether CUDA is usable here, answered without throwing: a machine with no
// driver or no GPU gets 0 devices and a status line that says which.

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "megalith/cuda/device.h"

namespace megalith::cuda {

namespace {

// cudaGetDeviceCount, with any error it leaves behind cleared so later
// unrelated checks do not report it.
cudaError_t count_devices(int* n) {
  *n = 0;
  cudaError_t e = cudaGetDeviceCount(n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    *n = 0;
  }
  return e;
}

std::string describe(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "device " + std::to_string(device) + " (properties unavailable)";
  }
  return std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
         std::to_string(prop.minor) + ")";
}

}  // namespace

bool compiled() { return true; }

int device_count() {
  int n = 0;
  count_devices(&n);
  return n;
}

std::string status() {
  int n = 0;
  cudaError_t e = count_devices(&n);
  if (e == cudaErrorNoDevice || (e == cudaSuccess && n == 0)) return "no device";
  if (e != cudaSuccess) return std::string("no driver: ") + cudaGetErrorString(e);
  // "2 device(s): NVIDIA H200 (sm_90)"; mixed machines list each kind with its count.
  std::vector<std::pair<std::string, int>> kinds;
  for (int d = 0; d < n; ++d) {
    std::string what = describe(d);
    bool seen = false;
    for (auto& k : kinds) {
      if (k.first == what) {
        ++k.second;
        seen = true;
      }
    }
    if (!seen) kinds.emplace_back(what, 1);
  }
  std::string out = std::to_string(n) + " device(s): ";
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    if (i) out += ", ";
    if (kinds.size() > 1) out += std::to_string(kinds[i].second) + "x ";
    out += kinds[i].first;
  }
  return out;
}

}  // namespace megalith::cuda
