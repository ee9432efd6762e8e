#pragma once
// Internals of AsyncIO shared by async_io.cpp (queue, requests) and
// transfer.cpp (moving one block through the direct or buffered descriptor).

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

class WorkerPool {
 public:
  WorkerPool(int threads, std::size_t block_bytes);
  ~WorkerPool();  // runs what is queued, then joins
  void push(std::vector<Block>&& blocks);

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
