#pragma once
// What the file I/O tests share: a scratch directory and misaligned host memory.

#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>

#include "megalith/memory/buffer.h"
#include "megalith/memory/host_resource.h"

namespace megalith_io_test {

/// A fresh directory under `base` (default $TMPDIR, or /tmp), removed at the end of the test.
struct TempDir {
  std::string path;
  explicit TempDir(const char* base = nullptr) {
    if (base == nullptr) base = std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp";
    std::string tmpl = std::string(base) + "/megalith-io-test-XXXXXX";
    path = mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path.empty()) std::filesystem::remove_all(path, ec);
  }
};

/// Host memory whose data starts `skew` bytes past a 4096-byte boundary.
struct Memory {
  std::shared_ptr<megalith::memory::Buffer> buf;
  char* p;
  Memory(std::size_t n, std::size_t skew)
      : buf(megalith::memory::Buffer::allocate(std::make_shared<megalith::memory::HostResource>(),
                                               n + skew + 1, 4096)),
        p(static_cast<char*>(buf->data()) + skew) {}
};

}  // namespace megalith_io_test
