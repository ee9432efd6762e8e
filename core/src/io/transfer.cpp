// Moving one block between memory and a file. The aligned middle of the block
// goes through the O_DIRECT descriptor (straight from the caller's memory when
// it is aligned like the file offset, else through the worker's bounce
// buffer); the unaligned head and tail through the buffered descriptor. See
// [Note: direct and buffered on one file] in megalith/io/file.h.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "engine_detail.h"
#include "megalith/io/error.h"
#include "megalith/memory/bytes.h"
#include "megalith/memory/host_resource.h"

namespace megalith::io::detail {
namespace {

using ::megalith::detail::concat;
using memory::format_bytes;

constexpr std::uint64_t kAlign = kDirectAlignment;

[[noreturn]] void fail(const RequestState& r, int code) {
  throw_errno(code,
              concat(r.write ? "cannot write " : "cannot read ", format_bytes(r.bytes),
                     " at offset ", r.offset, r.write ? " of" : " from"),
              r.file->path(), r.bytes, MEGALITH_WHERE);
}

[[noreturn]] void end_of_file(const RequestState& r) {
  throw io_error(0, concat("cannot read ", format_bytes(r.bytes), " at offset ", r.offset,
                           " from '", r.file->path(), "': the file ends at ", r.file->size(),
                           " bytes [", MEGALITH_WHERE, "]"));
}

/// One pread/pwrite; retries EINTR. Returns bytes moved, or -1 with errno set.
ssize_t move(int fd, bool write, std::uint64_t off, char* p, std::size_t n) {
  ssize_t r;
  do {
    r = write ? ::pwrite(fd, p, n, static_cast<off_t>(off))
              : ::pread(fd, p, n, static_cast<off_t>(off));
  } while (r < 0 && errno == EINTR);
  return r;
}

void buffered(const RequestState& r, std::uint64_t off, char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t got = move(r.file->buffered_fd(), r.write, off, p, n);
    if (got < 0) fail(r, errno);
    if (got == 0) {
      if (r.write) fail(r, ENOSPC);
      end_of_file(r);
    }
    off += static_cast<std::uint64_t>(got);
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

/// `off`, `p` and `n` are multiples of kAlign. Returns the bytes done; the
/// caller finishes the rest buffered (a short transfer at the end of the file
/// or of the disk, or a filesystem that refuses O_DIRECT transfers).
std::size_t direct(const RequestState& r, int fd, std::uint64_t off, char* p, std::size_t n) {
  std::size_t done = 0;
  while (done < n) {
    const ssize_t got = move(fd, r.write, off + done, p + done, n - done);
    if (got < 0) {
      if (errno == EINVAL && done == 0) r.file->disable_direct();  // opened, but no transfers
      if (errno == EINVAL) return done;
      fail(r, errno);
    }
    done += static_cast<std::size_t>(got);
    if (got == 0 || done % kAlign != 0) return done;
  }
  return done;
}

}  // namespace

void throw_transfer_error(const RequestState& r, int code) {
  if (code == 0) end_of_file(r);
  fail(r, code);
}

char* Bounce::get() {
  if (!buffer_) {
    buffer_ = memory::Buffer::allocate(std::make_shared<memory::HostResource>(), bytes_, kAlign);
  }
  return static_cast<char*>(buffer_->data());
}

void transfer(const Block& b, Bounce& bounce) {
  const RequestState& r = *b.request;
  const std::uint64_t begin = b.offset, end = b.offset + b.bytes;
  const std::uint64_t mid_begin = memory::align_up(begin, kAlign);
  const std::uint64_t mid_end = end / kAlign * kAlign;
  const int fd = r.file->direct_fd();
  if (fd < 0 || mid_begin >= mid_end) {
    buffered(r, begin, b.data, b.bytes);
    return;
  }
  if (mid_begin > begin) buffered(r, begin, b.data, mid_begin - begin);
  char* mid = b.data + (mid_begin - begin);
  const std::size_t mid_bytes = mid_end - mid_begin;
  std::size_t done;
  if (reinterpret_cast<std::uintptr_t>(mid) % kAlign == 0) {
    done = direct(r, fd, mid_begin, mid, mid_bytes);
  } else {  // misaligned memory: stage through the bounce buffer (block_bytes >= mid_bytes)
    char* staging = bounce.get();
    if (r.write) std::memcpy(staging, mid, mid_bytes);
    done = direct(r, fd, mid_begin, staging, mid_bytes);
    if (!r.write) std::memcpy(mid, staging, done);
  }
  if (done < mid_bytes) buffered(r, mid_begin + done, mid + done, mid_bytes - done);
  if (end > mid_end) buffered(r, mid_end, b.data + (mid_end - begin), end - mid_end);
}

}  // namespace megalith::io::detail
