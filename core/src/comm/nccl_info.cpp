// NCCL entry points that need no communicator: availability, version, unique id.
// Built with CUDA only (no_cuda.cpp answers in a build without it).

#include <cstring>
#include <string>
#include <vector>

#include "megalith/comm/nccl.h"
#include "megalith/error.h"
#include "nccl_api.h"

namespace megalith::comm {

bool nccl_available() {
  try {
    return nccl::try_api(nullptr) != nullptr;
  } catch (...) {
    return false;
  }
}

std::string nccl_version() { return nccl_version_string(nccl::api().version_code); }

std::vector<std::uint8_t> unique_id() {
  const nccl::Api& api = nccl::api();
  nccl::UniqueId id{};
  nccl::Result r = api.GetUniqueId(&id);
  if (r != nccl::success) {
    MEGALITH_FAIL(
        error, "megalith NCCL: ncclGetUniqueId failed: ", nccl::explain(api, r),
        " (it needs a usable network interface for NCCL's bootstrap; see NCCL_SOCKET_IFNAME)");
  }
  std::vector<std::uint8_t> out(sizeof(id.internal));
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

}  // namespace megalith::comm
