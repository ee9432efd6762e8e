#pragma once
// One io_uring driven through the raw system calls (no liburing): setup, the
// mapped submission and completion rings, submit-and-wait. Not thread-safe:
// one thread owns a Ring and does all of its submitting and reaping.

#include <linux/io_uring.h>

#include <cstddef>
#include <string>

namespace megalith::io::detail {

class Ring {
 public:
  /// Sets up a ring of at least `entries` submission entries. Throws io_error
  /// with the errno and the fix (use the thread backend) when it cannot.
  explicit Ring(unsigned entries);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  /// Submission entries the kernel gave (a power of two >= the asked).
  unsigned entries() const { return sq_entries_; }
  /// A zeroed entry to fill, or nullptr when the submission ring is full.
  io_uring_sqe* next_sqe();
  /// Hands the filled entries to the kernel and waits until at least
  /// `wait_for` completions are ready. Returns 0 or -errno of io_uring_enter;
  /// retries EINTR.
  int submit_and_wait(unsigned wait_for);
  /// Calls f(const io_uring_cqe&) for each ready completion, then frees them.
  template <typename F>
  void reap(F&& f);

  /// Why a ring cannot be set up here ("" when it can), with the fix.
  static std::string unavailable_reason();

 private:
  int fd_ = -1;
  void* sq_map_ = nullptr;
  void* cq_map_ = nullptr;  // == sq_map_ with IORING_FEAT_SINGLE_MMAP
  std::size_t sq_map_bytes_ = 0, cq_map_bytes_ = 0, sqes_bytes_ = 0;
  io_uring_sqe* sqes_ = nullptr;
  unsigned sq_entries_ = 0;
  unsigned *sq_head_ = nullptr, *sq_tail_ = nullptr, *sq_mask_ = nullptr;
  unsigned *cq_head_ = nullptr, *cq_tail_ = nullptr, *cq_mask_ = nullptr;
  io_uring_cqe* cqes_ = nullptr;
  unsigned local_tail_ = 0;  // entries filled; published to the kernel by submit_and_wait
};

// The kernel writes the completion tail and reads the head we store: acquire
// the tail before reading the entries, release the head after.
template <typename F>
void Ring::reap(F&& f) {
  unsigned head = *cq_head_;
  const unsigned tail = __atomic_load_n(cq_tail_, __ATOMIC_ACQUIRE);
  for (; head != tail; ++head) f(static_cast<const io_uring_cqe&>(cqes_[head & *cq_mask_]));
  __atomic_store_n(cq_head_, head, __ATOMIC_RELEASE);
}

}  // namespace megalith::io::detail
