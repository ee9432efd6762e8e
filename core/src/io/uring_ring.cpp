// The io_uring system calls and ring mappings, written against the kernel's
// uapi header <linux/io_uring.h> (see io_uring_setup(2), io_uring_enter(2)).
#include "uring_ring.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "megalith/io/error.h"

#ifndef IORING_FEAT_NATIVE_WORKERS
#define IORING_FEAT_NATIVE_WORKERS (1U << 9)
#endif

namespace megalith::io::detail {
namespace {

using ::megalith::detail::concat;

// Since Linux 5.12 the ring's async workers are threads of this process
// (sharing its credentials and limits, RLIMIT_FSIZE included) and ring memory
// is no longer charged to RLIMIT_MEMLOCK; IORING_OP_READ/WRITE date from 5.6.
constexpr unsigned kRequiredFeatures =
    IORING_FEAT_SINGLE_MMAP | IORING_FEAT_NODROP | IORING_FEAT_NATIVE_WORKERS;

const char* fix() {
  return "use the thread backend (IOOptions::backend = Backend::threads, "
         "MEGALITH_IO_BACKEND=threads, or AsyncIO(backend=\"threads\") in Python)";
}

/// ", kernel.io_uring_disabled = N" when the sysctl is there and not 0.
std::string sysctl_note() {
  std::ifstream f("/proc/sys/kernel/io_uring_disabled");
  int v = 0;
  if (!(f >> v) || v == 0) return "";
  return concat("; /proc/sys/kernel/io_uring_disabled is ", v,
                v == 1 ? " (only members of kernel.io_uring_group may use it)" : " (off for all)");
}

/// io_uring_setup, or -errno. `why` says what the kernel lacks when the ring
/// was set up but misses a feature (then the ring is closed and -ENOSYS returned).
int setup(unsigned entries, io_uring_params& p, std::string& why) {
  std::memset(&p, 0, sizeof(p));
  const long fd = ::syscall(__NR_io_uring_setup, entries, &p);
  if (fd < 0) return -errno;
  if ((p.features & kRequiredFeatures) != kRequiredFeatures) {
    ::close(static_cast<int>(fd));
    char features[64];
    std::snprintf(features, sizeof(features), "has 0x%x, needs 0x%x", p.features,
                  kRequiredFeatures);
    why = concat("the kernel's io_uring lacks features megalith needs (", features,
                 "): Linux 5.12 or later has them");
    return -ENOSYS;
  }
  return static_cast<int>(fd);
}

}  // namespace

std::string Ring::unavailable_reason() {
  io_uring_params p;
  std::string why;
  const int fd = setup(2, p, why);
  if (fd >= 0) {
    ::close(fd);
    return "";
  }
  if (why.empty()) why = concat("io_uring_setup failed: ", errno_text(-fd), sysctl_note());
  return concat("io_uring is not available here: ", why, "; ", fix());
}

Ring::Ring(unsigned entries) {
  io_uring_params p;
  std::string why;
  fd_ = setup(entries, p, why);
  if (fd_ < 0) {
    const int code = -fd_;
    if (why.empty()) why = concat("io_uring_setup failed: ", errno_text(code), sysctl_note());
    throw io_error(code, concat("io_uring is not available here: ", why, "; ", fix()));
  }
  sq_entries_ = p.sq_entries;
  // With IORING_FEAT_SINGLE_MMAP one mapping holds both rings: map the larger size.
  sq_map_bytes_ = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  cq_map_bytes_ = p.cq_off.cqes + p.cq_entries * sizeof(io_uring_cqe);
  sq_map_bytes_ = cq_map_bytes_ = std::max(sq_map_bytes_, cq_map_bytes_);
  sqes_bytes_ = p.sq_entries * sizeof(io_uring_sqe);
  sq_map_ = ::mmap(nullptr, sq_map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd_,
                   IORING_OFF_SQ_RING);
  void* sqes = sq_map_ == MAP_FAILED ? MAP_FAILED
                                     : ::mmap(nullptr, sqes_bytes_, PROT_READ | PROT_WRITE,
                                              MAP_SHARED | MAP_POPULATE, fd_, IORING_OFF_SQES);
  if (sq_map_ == MAP_FAILED || sqes == MAP_FAILED) {
    const int code = errno;
    if (sq_map_ != MAP_FAILED) ::munmap(sq_map_, sq_map_bytes_);
    ::close(fd_);
    throw io_error(code, concat("io_uring is not available here: mapping its rings failed: ",
                                errno_text(code), "; ", fix()));
  }
  cq_map_ = sq_map_;
  sqes_ = static_cast<io_uring_sqe*>(sqes);
  char* sq = static_cast<char*>(sq_map_);
  sq_head_ = reinterpret_cast<unsigned*>(sq + p.sq_off.head);
  sq_tail_ = reinterpret_cast<unsigned*>(sq + p.sq_off.tail);
  sq_mask_ = reinterpret_cast<unsigned*>(sq + p.sq_off.ring_mask);
  char* cq = static_cast<char*>(cq_map_);
  cq_head_ = reinterpret_cast<unsigned*>(cq + p.cq_off.head);
  cq_tail_ = reinterpret_cast<unsigned*>(cq + p.cq_off.tail);
  cq_mask_ = reinterpret_cast<unsigned*>(cq + p.cq_off.ring_mask);
  cqes_ = reinterpret_cast<io_uring_cqe*>(cq + p.cq_off.cqes);
  // The submission ring holds indices into the entry array: entry i always sits at slot i.
  unsigned* array = reinterpret_cast<unsigned*>(sq + p.sq_off.array);
  for (unsigned i = 0; i < p.sq_entries; ++i) array[i] = i;
  local_tail_ = *sq_tail_;
}

Ring::~Ring() {
  ::munmap(sqes_, sqes_bytes_);
  ::munmap(sq_map_, sq_map_bytes_);
  ::close(fd_);
}

io_uring_sqe* Ring::next_sqe() {
  const unsigned head = __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
  if (local_tail_ - head >= sq_entries_) return nullptr;
  io_uring_sqe* sqe = &sqes_[local_tail_ & *sq_mask_];
  ++local_tail_;
  std::memset(sqe, 0, sizeof(*sqe));
  return sqe;
}

int Ring::submit_and_wait(unsigned wait_for) {
  // Publish the filled entries: their contents before the tail that shows them.
  __atomic_store_n(sq_tail_, local_tail_, __ATOMIC_RELEASE);
  for (;;) {
    const unsigned to_submit = local_tail_ - __atomic_load_n(sq_head_, __ATOMIC_ACQUIRE);
    const unsigned flags = wait_for > 0 ? IORING_ENTER_GETEVENTS : 0;
    const long r = ::syscall(__NR_io_uring_enter, fd_, to_submit, wait_for, flags, nullptr, 0);
    // Entries the kernel did not take (r < to_submit) stay for the next call.
    if (r >= 0) return 0;
    if (errno != EINTR) return -errno;
  }
}

}  // namespace megalith::io::detail
