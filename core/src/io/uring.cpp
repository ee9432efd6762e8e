// The io_uring backend: the ring thread's loop, and what a completion means
// for its block (done, a short transfer to resubmit, a switch from the
// O_DIRECT descriptor to the buffered one, or an error). See [Note: one
// thread submits and reaps] in uring.h.
#include "uring.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "megalith/io/error.h"

namespace megalith::io::detail {
namespace {

using ::megalith::detail::concat;

constexpr std::uint64_t kAlign = kDirectAlignment;
constexpr std::uint64_t kWakeTag = ~std::uint64_t{0};  // user_data of the eventfd poll
// The length of one read or write is 32 bits; Linux moves at most ~2 GiB per call anyway.
constexpr std::size_t kMaxOpBytes = std::size_t{1} << 30;

bool aligned(std::uint64_t v) { return v % kAlign == 0; }

/// Whether the ring moves `b` (see uring.h); the thread pool takes the rest.
bool ring_takes(const Block& b) {
  if (b.request->file->direct_fd() < 0) return true;
  return aligned(b.offset) && aligned(b.bytes) && aligned(reinterpret_cast<std::uintptr_t>(b.data));
}

std::exception_ptr error_of(const RequestState& r, int code) {
  try {
    throw_transfer_error(r, code);
  } catch (...) {
    return std::current_exception();
  }
}

void poke(int fd) {
  const std::uint64_t one = 1;
  while (::write(fd, &one, sizeof(one)) < 0 && errno == EINTR) {
  }
}

}  // namespace

UringPool::UringPool(int queue_depth, int fallback_threads, std::size_t block_bytes)
    : ring_(static_cast<unsigned>(queue_depth) + 1),  // + the eventfd poll
      fallback_threads_(fallback_threads),
      block_bytes_(block_bytes) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int code = errno;
    throw io_error(code, concat("AsyncIO: eventfd for the io_uring backend failed: ",
                                std::strerror(code), " (errno ", code, ")"));
  }
  ops_.resize(static_cast<std::size_t>(queue_depth));
  for (unsigned i = static_cast<unsigned>(queue_depth); i-- > 0;) free_.push_back(i);
  thread_ = std::thread([this] { run(); });
}

UringPool::~UringPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  poke(wake_fd_);
  thread_.join();
  fallback_.reset();  // runs what it holds
  ::close(wake_fd_);  // the ring, closed after this body, drops the poll still armed on it
}

WorkerPool& UringPool::fallback() {
  std::call_once(fallback_once_, [this] {
    fallback_ = std::make_unique<WorkerPool>(fallback_threads_, block_bytes_);
  });
  return *fallback_;
}

void UringPool::push(std::vector<Block>&& blocks) {
  std::vector<Block> others;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : blocks) (ring_takes(b) ? incoming_ : others).push_back(std::move(b));
  }
  if (others.size() < blocks.size()) poke(wake_fd_);
  if (!others.empty()) fallback().push(std::move(others));
}

void UringPool::arm_wake() {
  io_uring_sqe* sqe = ring_.next_sqe();  // never null: see run()
  sqe->opcode = IORING_OP_POLL_ADD;
  sqe->fd = wake_fd_;
  sqe->poll32_events = POLLIN;
  sqe->user_data = kWakeTag;
}

// The ring has queue depth + 1 entries and each slot, like the poll, has at
// most one entry in it at a time, so next_sqe() always has one to give.
void UringPool::run() {
  bool wake_armed = false;
  for (;;) {
    if (!wake_armed) {
      arm_wake();
      wake_armed = true;
    }
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& b : incoming_) waiting_.push_back(std::move(b));
      incoming_.clear();
      stopping = stopping_;
    }
    while (!free_.empty() && !waiting_.empty()) {
      Block b = std::move(waiting_.front());
      waiting_.pop_front();
      if (b.request->failed.load()) {  // after one block failed, the rest of the request is skipped
        finish(b, nullptr);
        continue;
      }
      const unsigned slot = free_.back();
      free_.pop_back();
      start(slot, std::move(b));
    }
    if (stopping && waiting_.empty() && free_.size() == ops_.size()) return;
    if (const int rc = ring_.submit_and_wait(1); rc < 0) {
      if (rc != -EAGAIN && rc != -EBUSY && rc != -ENOMEM) {
        // The ring itself is gone (EBADF, EFAULT, ...): blocks in it can be
        // neither finished nor waited for, and waiters would hang.
        std::fprintf(stderr, "megalith AsyncIO: io_uring_enter failed: %s (errno %d)\n",
                     std::strerror(-rc), -rc);
        std::abort();
      }
      // Out of kernel resources for now: reap what completed, try again shortly.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ring_.reap([&](const io_uring_cqe& cqe) {
      if (cqe.user_data == kWakeTag) {
        std::uint64_t count;
        while (::read(wake_fd_, &count, sizeof(count)) < 0 && errno == EINTR) {
        }
        wake_armed = false;
      } else {
        complete(static_cast<unsigned>(cqe.user_data), cqe.res);
      }
    });
  }
}

void UringPool::start(unsigned slot, Block&& b) {
  Op& op = ops_[slot];
  const File& file = *b.request->file;
  op.block = std::move(b);
  op.fd = file.direct_fd();
  op.on_direct = op.fd >= 0;
  if (!op.on_direct) op.fd = file.buffered_fd();
  op.done = 0;
  prepare(slot);
}

void UringPool::prepare(unsigned slot) {
  const Op& op = ops_[slot];
  io_uring_sqe* sqe = ring_.next_sqe();
  sqe->opcode = op.block.request->write ? IORING_OP_WRITE : IORING_OP_READ;
  sqe->fd = op.fd;
  sqe->addr = reinterpret_cast<std::uintptr_t>(op.block.data + op.done);
  sqe->len = static_cast<unsigned>(std::min(op.block.bytes - op.done, kMaxOpBytes));
  sqe->off = op.block.offset + op.done;
  sqe->user_data = slot;
}

// The same outcomes as transfer() in transfer.cpp, one completion at a time.
void UringPool::complete(unsigned slot, int res) {
  Op& op = ops_[slot];
  const RequestState& r = *op.block.request;
  const auto to_buffered = [&] {
    op.fd = r.file->buffered_fd();
    op.on_direct = false;
    prepare(slot);
  };
  if (res == -EINTR || res == -EAGAIN) return prepare(slot);
  if (res < 0) {
    if (op.on_direct && res == -EINVAL) {
      if (op.done == 0) r.file->disable_direct();  // opened with O_DIRECT, but no transfers
      return to_buffered();
    }
    return end(slot, error_of(r, -res));
  }
  if (res == 0) {  // the end of the file or of the disk: the buffered descriptor says which
    if (op.on_direct) return to_buffered();
    return end(slot, error_of(r, r.write ? ENOSPC : 0));
  }
  op.done += static_cast<std::size_t>(res);
  if (op.done == op.block.bytes) return end(slot, nullptr);
  if (op.on_direct && !aligned(op.done)) return to_buffered();  // the rest is unaligned
  prepare(slot);
}

void UringPool::end(unsigned slot, std::exception_ptr error) {
  finish(ops_[slot].block, std::move(error));
  ops_[slot].block = Block{};  // drops the request (and its file) now
  free_.push_back(slot);
}

}  // namespace megalith::io::detail
