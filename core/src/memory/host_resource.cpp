// Pageable host memory, aligned by the C library.
#include "megalith/memory/host_resource.h"

#include <cerrno>
#include <cstddef>
#include <cstdlib>

#include "megalith/error.h"

#if defined(_WIN32)
#include <malloc.h>
#else
#include <unistd.h>
#endif

namespace megalith::memory {

std::size_t host_available_bytes() {
#if defined(_SC_AVPHYS_PAGES) && defined(_SC_PAGESIZE)
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    return static_cast<std::size_t>(pages) * static_cast<std::size_t>(page);
#endif
  return 0;
}

void* HostResource::do_allocate(std::size_t bytes, std::size_t alignment) {
  // posix_memalign needs a multiple of sizeof(void*); malloc's own alignment is free anyway.
  if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
  void* p = nullptr;
#if defined(_WIN32)
  p = _aligned_malloc(bytes, alignment);
  int rc = p ? 0 : ENOMEM;
#else
  int rc = posix_memalign(&p, alignment, bytes);
#endif
  if (rc != 0 || p == nullptr) {
    throw_out_of_memory(*this, bytes, host_available_bytes(), "the C library refused it",
                        MEGALITH_WHERE);
  }
  return p;
}

void HostResource::do_deallocate(void* ptr, std::size_t, std::size_t) noexcept {
#if defined(_WIN32)
  _aligned_free(ptr);
#else
  std::free(ptr);
#endif
}

}  // namespace megalith::memory
