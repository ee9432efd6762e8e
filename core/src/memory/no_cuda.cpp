// The CUDA memory resources and copies of a build without the CUDA toolkit:
// the symbols exist (embedders and the bindings link) and say how to get them.
#include "copy_engine.h"
#include "megalith/error.h"
#include "megalith/memory/device_resource.h"
#include "megalith/memory/pinned_host_resource.h"

namespace megalith::memory {

namespace {
[[noreturn]] void compiled_out(const char* what) {
  MEGALITH_FAIL(error, what,
                ": megalith was built without CUDA; rebuild with MEGALITH_CUDA=ON (and nvcc on "
                "PATH) to get pinned host and device memory");
}
}  // namespace

PinnedHostResource::PinnedHostResource() { compiled_out("PinnedHostResource"); }
void* PinnedHostResource::do_allocate(std::size_t, std::size_t) {
  compiled_out("PinnedHostResource");
}
void PinnedHostResource::do_deallocate(void*, std::size_t, std::size_t) noexcept {}

DeviceResource::DeviceResource(int device) : device_(device) { compiled_out("DeviceResource"); }
std::string DeviceResource::name() const { return "device(" + std::to_string(device_) + ")"; }
void* DeviceResource::do_allocate(std::size_t, std::size_t) { compiled_out("DeviceResource"); }
void DeviceResource::do_deallocate(void*, std::size_t, std::size_t) noexcept {}

void device_memory_info(int, std::size_t*, std::size_t*) { compiled_out("device_memory_info"); }

}  // namespace megalith::memory

namespace megalith::memory::detail {
std::shared_ptr<CopyEvent> copy_async(void*, const void*, std::size_t, int, void*, CopyEvent*) {
  compiled_out("chunk copy to or from the device tier");
}
}  // namespace megalith::memory::detail
