#pragma once
// Asynchronous file reads and writes on a pool of I/O threads. A request is
// cut into blocks of `block_bytes` (at block-aligned file offsets) that the
// workers run in parallel with the blocks of every other request in flight.
// Errors of a worker are stored in its request and thrown by Request::wait().
// Requests on one file must not overlap while both are in flight.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "megalith/export.h"
#include "megalith/io/file.h"

namespace megalith::io {

struct IOOptions {
  int threads = 4;                                 ///< I/O worker threads, >= 1
  std::size_t block_bytes = std::size_t{8} << 20;  ///< rounded up to kDirectAlignment
  bool direct = true;                              ///< use O_DIRECT where it works
};

namespace detail {
struct RequestState;
class WorkerPool;
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
  /// Throws invalid_argument for threads < 1 or block_bytes == 0.
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
  const IOOptions& options() const { return options_; }

 private:
  Request submit(const std::shared_ptr<File>& file, bool write, std::uint64_t offset, void* data,
                 std::size_t bytes);

  IOOptions options_;
  std::unique_ptr<detail::WorkerPool> pool_;
};

}  // namespace megalith::io
