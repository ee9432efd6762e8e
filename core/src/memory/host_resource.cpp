// Pageable host memory, aligned by the C library. Large blocks are 2 MiB aligned and
// advised for transparent huge pages: the CPU optimizer streams tens of GB per step, and
// with 4 KiB pages the TLB misses cost it about a fifth of its speed on a 16-core host
// (benchmarks/optim/host_adam_large.py: 4.1 against 5.1 Gparam/s over 1e9 params).
#include "megalith/memory/host_resource.h"

#include <cerrno>
#include <cstddef>
#include <cstdlib>

#include "megalith/error.h"

#if defined(_WIN32)
#include <malloc.h>
#else
#include <sys/mman.h>
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
  const bool huge = bytes >= kHugePageBytes;
  if (huge && alignment < kHugePageBytes) alignment = kHugePageBytes;
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
#if defined(MADV_HUGEPAGE)
  // Advice only: where the kernel has THP off, this fails or does nothing, and the
  // memory is as good as before.
  if (huge) (void)madvise(p, bytes - bytes % kHugePageBytes, MADV_HUGEPAGE);
#endif
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
