// AsyncIO: requests cut into blocks, the choice of backend, and the thread
// backend (a queue and the worker threads that run it).
#include "megalith/io/async_io.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <utility>

#include "engine_detail.h"
#include "megalith/error.h"
#include "megalith/io/error.h"
#include "megalith/memory/bytes.h"
#ifdef MEGALITH_HAVE_IO_URING
#include "uring.h"
#endif

namespace megalith::io {
namespace detail {

void finish(const Block& b, std::exception_ptr error) {
  RequestState& r = *b.request;
  std::lock_guard<std::mutex> lock(r.mu);
  if (error && !r.error) {
    r.error = std::move(error);
    r.failed.store(true);
  }
  if (--r.pending == 0) r.cv.notify_all();
}

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
    std::exception_ptr error;
    if (!b.request->failed.load()) {  // after one block failed, the rest of the request is skipped
      try {
        transfer(b, bounce);
      } catch (...) {
        error = std::current_exception();
      }
    }
    finish(b, std::move(error));
  }
}

}  // namespace detail

Backend parse_backend(const std::string& name) {
  if (name == "threads") return Backend::threads;
  if (name == "uring") return Backend::uring;
  if (name == "auto") return Backend::automatic;
  MEGALITH_FAIL(invalid_argument,
                "AsyncIO: backend must be \"threads\", \"uring\" or \"auto\", got \"", name, "\"");
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::threads:
      return "threads";
    case Backend::uring:
      return "uring";
    case Backend::automatic:
      break;
  }
  return "auto";
}

#ifdef MEGALITH_HAVE_IO_URING
std::string uring_unavailable_reason() { return detail::Ring::unavailable_reason(); }
#else
std::string uring_unavailable_reason() {
  return "io_uring is not available here: this megalith was built without "
         "<linux/io_uring.h> (install the kernel's uapi headers, e.g. linux-libc-dev, and "
         "rebuild); use backend threads (MEGALITH_IO_BACKEND=threads)";
}
#endif

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
  MEGALITH_EXPECTS(options_.queue_depth >= 1 && options_.queue_depth <= 4096, invalid_argument,
                   "AsyncIO: queue_depth must be in 1..4096, got ", options_.queue_depth);
  options_.block_bytes = memory::align_up(options_.block_bytes, kDirectAlignment);
  Backend wanted = options_.backend;
  if (wanted == Backend::automatic) {
    if (const char* env = std::getenv("MEGALITH_IO_BACKEND"); env != nullptr && *env != '\0') {
      try {
        wanted = parse_backend(env);
      } catch (const invalid_argument&) {
        MEGALITH_FAIL(invalid_argument, "MEGALITH_IO_BACKEND must be threads, uring or auto, got '",
                      env, "'");
      }
    }
  }
  if (wanted != Backend::threads) {
#ifdef MEGALITH_HAVE_IO_URING
    try {
      pool_ = std::make_unique<detail::UringPool>(options_.queue_depth, options_.threads,
                                                  options_.block_bytes);
      backend_ = Backend::uring;
    } catch (const io_error&) {
      if (wanted == Backend::uring) throw;  // asked for by name: say why it cannot be had
    }
#else
    if (wanted == Backend::uring)
      throw io_error(ENOSYS, "AsyncIO: backend uring: " + uring_unavailable_reason());
#endif
  }
  if (!pool_) {
    pool_ = std::make_unique<detail::WorkerPool>(options_.threads, options_.block_bytes);
    backend_ = Backend::threads;
  }
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
