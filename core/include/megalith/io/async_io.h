#pragma once
// Asynchronous file reads and writes. A request is cut into blocks of
// `block_bytes` (at block-aligned file offsets) that run in parallel with the
// blocks of every other request in flight, on one of two backends: a pool of
// I/O threads (pread/pwrite), or one io_uring per AsyncIO whose own thread
// submits the blocks and reaps their completions (Linux 5.12 and later, where
// the kernel allows it). Errors are stored in their request and thrown by
// Request::wait(). Requests on one file must not overlap while both are in flight.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "megalith/export.h"
#include "megalith/io/file.h"

namespace megalith::io {

/// What runs the blocks. `automatic` takes io_uring when the kernel lets this
/// process set up a ring and the thread pool otherwise; the environment
/// variable MEGALITH_IO_BACKEND=threads|uring|auto overrides it (and only it).
enum class Backend { threads, uring, automatic };

struct IOOptions {
  /// I/O worker threads, >= 1: the thread backend's, and the uring backend's
  /// for the blocks its ring does not take (those of a direct file with
  /// misaligned memory or an unaligned head or tail), started at first need.
  int threads = 4;
  std::size_t block_bytes = std::size_t{8} << 20;  ///< rounded up to kDirectAlignment
  bool direct = true;                              ///< use O_DIRECT where it works
  Backend backend = Backend::automatic;
  int queue_depth = 64;  ///< uring: blocks in flight in the ring, 1..4096
};

/// "threads", "uring" or "auto" (the names MEGALITH_IO_BACKEND and Python
/// use); throws invalid_argument naming the allowed values for any other.
MEGALITH_API Backend parse_backend(const std::string& name);
MEGALITH_API const char* backend_name(Backend backend);

/// Empty when this process can set up an io_uring for AsyncIO, else why not
/// (the errno text of io_uring_setup, kernel.io_uring_disabled, or a kernel
/// older than 5.12), and the fix.
MEGALITH_API std::string uring_unavailable_reason();

namespace detail {
struct RequestState;
class Executor;
}  // namespace detail

/// A ticket for one read or write. Copies share the request.
class MEGALITH_API Request {
 public:
  Request() = default;
  /// Blocks until every block of the request finished, then throws the first
  /// error a block met (io_error / disk_full naming the path, offset and bytes).
  void wait() const;
  /// True once every block finished (with or without an error). Never throws.
  bool done() const noexcept;
  std::size_t nbytes() const noexcept;
  /// Whether the file is read or written with O_DIRECT (its aligned part).
  bool direct() const noexcept;
  bool valid() const noexcept { return state_ != nullptr; }

 private:
  friend class AsyncIO;
  explicit Request(std::shared_ptr<detail::RequestState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::RequestState> state_;
};

class MEGALITH_API AsyncIO {
 public:
  /// Throws invalid_argument for threads < 1, block_bytes == 0, a queue_depth
  /// out of range or a bad MEGALITH_IO_BACKEND; io_error naming the reason for
  /// Backend::uring where io_uring is not available.
  explicit AsyncIO(IOOptions options = {});
  /// Finishes every queued block, then joins the workers.
  ~AsyncIO();
  AsyncIO(const AsyncIO&) = delete;
  AsyncIO& operator=(const AsyncIO&) = delete;

  /// Reads `bytes` at `offset` of the file into `dst`. A read past the end of
  /// the file fails (at wait) with io_error.
  Request read(const std::string& path, std::uint64_t offset, void* dst, std::size_t bytes);
  /// Writes `bytes` from `src` at `offset`; creates the file when missing.
  Request write(const std::string& path, std::uint64_t offset, const void* src, std::size_t bytes);
  /// The same on a descriptor the caller keeps open until the request is done.
  Request read(int fd, std::uint64_t offset, void* dst, std::size_t bytes);
  Request write(int fd, std::uint64_t offset, const void* src, std::size_t bytes);
  /// The same on a file already opened (SwapFile keeps one open).
  Request read(const std::shared_ptr<File>& file, std::uint64_t offset, void* dst,
               std::size_t bytes);
  Request write(const std::shared_ptr<File>& file, std::uint64_t offset, const void* src,
                std::size_t bytes);

  /// Whether requests on `path` would use O_DIRECT: options().direct and the
  /// filesystem allows it (see direct_io_supported).
  bool direct_io_active(const std::string& path) const;
  /// Options as given (options().backend may say automatic).
  const IOOptions& options() const { return options_; }
  /// The backend in use: threads or uring, never automatic.
  Backend backend() const { return backend_; }

 private:
  Request submit(const std::shared_ptr<File>& file, bool write, std::uint64_t offset, void* data,
                 std::size_t bytes);

  IOOptions options_;
  Backend backend_ = Backend::threads;
  std::unique_ptr<detail::Executor> pool_;
};

}  // namespace megalith::io
