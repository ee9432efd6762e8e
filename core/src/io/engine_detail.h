#pragma once
// Internals of AsyncIO shared by async_io.cpp (requests, the thread backend),
// transfer.cpp (moving one block through the direct or buffered descriptor)
// and uring.cpp (the io_uring backend).

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "megalith/io/file.h"
#include "megalith/memory/buffer.h"

namespace megalith::io::detail {

struct RequestState {
  std::shared_ptr<File> file;
  bool write = false;
  bool direct = false;
  std::uint64_t offset = 0;  // of the whole request, for messages
  std::size_t bytes = 0;

  std::mutex mu;
  std::condition_variable cv;
  std::size_t pending = 0;   // blocks not finished
  std::exception_ptr error;  // the first block's error
  std::atomic<bool> failed{false};
};

/// One piece of a request: at most block_bytes, never across a multiple of block_bytes.
struct Block {
  std::shared_ptr<RequestState> request;
  std::uint64_t offset;
  char* data;
  std::size_t bytes;
};

/// Marks `b` finished, keeping `error` when it is the request's first; wakes
/// the waiters when it was the request's last block.
void finish(const Block& b, std::exception_ptr error);

/// A worker's aligned staging memory for O_DIRECT transfers of misaligned user memory.
class Bounce {
 public:
  explicit Bounce(std::size_t bytes) : bytes_(bytes) {}
  char* get();  // allocated at first use, from the host resource, kDirectAlignment-aligned

 private:
  std::size_t bytes_;
  std::shared_ptr<memory::Buffer> buffer_;
};

/// Reads or writes one block; throws io_error / disk_full.
void transfer(const Block& b, Bounce& bounce);

/// The error transfer() throws for a block of `r` that failed with errno
/// `code`: disk_full for ENOSPC/EDQUOT/EFBIG, io_error otherwise, and for
/// code 0 the io_error of a read that met the end of the file.
[[noreturn]] void throw_transfer_error(const RequestState& r, int code);

/// What runs the blocks of AsyncIO's requests: a thread pool or an io_uring.
/// The destructor finishes every block pushed before it returns.
class Executor {
 public:
  virtual ~Executor() = default;
  /// Thread-safe; every block is finish()ed exactly once.
  virtual void push(std::vector<Block>&& blocks) = 0;
};

/// Threads that each take a block from a queue and transfer() it.
class WorkerPool final : public Executor {
 public:
  WorkerPool(int threads, std::size_t block_bytes);
  ~WorkerPool() override;  // runs what is queued, then joins
  void push(std::vector<Block>&& blocks) override;

 private:
  void run();
  std::size_t block_bytes_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Block> queue_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace megalith::io::detail
