// AsyncIO: requests cut into blocks, a queue, and the worker threads that run them.
#include "megalith/io/async_io.h"

#include <algorithm>
#include <utility>

#include "engine_detail.h"
#include "megalith/error.h"
#include "megalith/memory/bytes.h"

namespace megalith::io {
namespace detail {

WorkerPool::WorkerPool(int threads, std::size_t block_bytes) : block_bytes_(block_bytes) {
  threads_.reserve(static_cast<std::size_t>(threads));
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkerPool::push(std::vector<Block>&& blocks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& b : blocks) queue_.push_back(std::move(b));
  }
  if (blocks.size() == 1) {
    cv_.notify_one();
  } else {
    cv_.notify_all();
  }
}

void WorkerPool::run() {
  Bounce bounce(block_bytes_);
  for (;;) {
    Block b;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left to run
      b = std::move(queue_.front());
      queue_.pop_front();
    }
    RequestState& r = *b.request;
    std::exception_ptr error;
    if (!r.failed.load()) {  // after one block failed, the rest of the request is skipped
      try {
        transfer(b, bounce);
      } catch (...) {
        error = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(r.mu);
    if (error && !r.error) {
      r.error = error;
      r.failed.store(true);
    }
    if (--r.pending == 0) r.cv.notify_all();
  }
}

}  // namespace detail

void Request::wait() const {
  if (!state_) return;
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->pending == 0; });
  if (state_->error) std::rethrow_exception(state_->error);
}

bool Request::done() const noexcept {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->pending == 0;
}

std::size_t Request::nbytes() const noexcept { return state_ ? state_->bytes : 0; }
bool Request::direct() const noexcept { return state_ && state_->direct; }

AsyncIO::AsyncIO(IOOptions options) : options_(options) {
  MEGALITH_EXPECTS(options_.threads >= 1, invalid_argument,
                   "AsyncIO: threads must be at least 1, got ", options_.threads);
  MEGALITH_EXPECTS(options_.block_bytes > 0, invalid_argument,
                   "AsyncIO: block_bytes must be positive, got 0");
  options_.block_bytes = memory::align_up(options_.block_bytes, kDirectAlignment);
  pool_ = std::make_unique<detail::WorkerPool>(options_.threads, options_.block_bytes);
}

AsyncIO::~AsyncIO() = default;

Request AsyncIO::submit(const std::shared_ptr<File>& file, bool write, std::uint64_t offset,
                        void* data, std::size_t bytes) {
  MEGALITH_EXPECTS(data != nullptr || bytes == 0, invalid_argument, "AsyncIO.",
                   write ? "write" : "read", ": null buffer for ", bytes, " bytes of '",
                   file->path(), "'");
  auto state = std::make_shared<detail::RequestState>();
  state->file = file;
  state->write = write;
  state->direct = file->direct();
  state->offset = offset;
  state->bytes = bytes;
  const std::uint64_t block = options_.block_bytes, end = offset + bytes;
  std::vector<detail::Block> blocks;
  blocks.reserve(static_cast<std::size_t>(bytes / block + 2));
  for (std::uint64_t at = offset; at < end;) {
    const std::uint64_t next = std::min(end, (at / block + 1) * block);
    blocks.push_back(
        {state, at, static_cast<char*>(data) + (at - offset), static_cast<std::size_t>(next - at)});
    at = next;
  }
  state->pending = blocks.size();
  if (!blocks.empty()) pool_->push(std::move(blocks));
  return Request(std::move(state));
}

Request AsyncIO::read(const std::shared_ptr<File>& file, std::uint64_t offset, void* dst,
                      std::size_t bytes) {
  return submit(file, false, offset, dst, bytes);
}

Request AsyncIO::write(const std::shared_ptr<File>& file, std::uint64_t offset, const void* src,
                       std::size_t bytes) {
  // The buffer is only read from; the block carries one pointer type for both directions.
  return submit(file, true, offset, const_cast<void*>(src), bytes);
}

Request AsyncIO::read(const std::string& path, std::uint64_t offset, void* dst, std::size_t bytes) {
  return read(File::open(path, Access::read, options_.direct), offset, dst, bytes);
}

Request AsyncIO::write(const std::string& path, std::uint64_t offset, const void* src,
                       std::size_t bytes) {
  return write(File::open(path, Access::write, options_.direct), offset, src, bytes);
}

Request AsyncIO::read(int fd, std::uint64_t offset, void* dst, std::size_t bytes) {
  return read(File::adopt(fd, options_.direct), offset, dst, bytes);
}

Request AsyncIO::write(int fd, std::uint64_t offset, const void* src, std::size_t bytes) {
  return write(File::adopt(fd, options_.direct), offset, src, bytes);
}

bool AsyncIO::direct_io_active(const std::string& path) const {
  return options_.direct && direct_io_supported(path);
}

}  // namespace megalith::io
