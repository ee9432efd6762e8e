#pragma once
// NCCL, loaded at run time. The engine is built against no NCCL library: the
// first call that needs NCCL dlopen()s libnccl.so.2 and looks up a table of
// functions, so `import megalith` and every non-NCCL part work on machines
// without NCCL, and the error when it is missing lists where it looked.
//
// Search order (first that loads with every required symbol wins):
//   1. the directory given to set_nccl_search_path() (megalith_comm passes the
//      nvidia-nccl-cu13 wheel's lib directory);
//   2. $MEGALITH_NCCL_PATH: a file, or a directory holding libnccl.so.2;
//   3. $CUDA_HOME/lib64, then /usr/local/cuda/lib64;
//   4. the system loader (LD_LIBRARY_PATH, ldconfig cache): plain "libnccl.so.2".

#include <cstdint>
#include <string>
#include <vector>

#include "megalith/export.h"

namespace megalith::comm {

/// Bytes of an NCCL unique id (NCCL_UNIQUE_ID_BYTES).
constexpr std::size_t kUniqueIdBytes = 128;

/// Oldest NCCL the engine accepts: ncclAvg and bfloat16 arrived in 2.10.
constexpr int kMinNcclVersionCode = 21000;

/// Where to look first for libnccl.so.2 (a directory). Has no effect once NCCL
/// is loaded. An empty string clears it.
MEGALITH_API void set_nccl_search_path(const std::string& dir);

/// The paths the loader tries, in order, given the search path and environment now.
MEGALITH_API std::vector<std::string> nccl_search_candidates();

/// What trying a list of candidates found. Used by the loader and by tests.
struct NcclProbe {
  bool ok = false;
  std::string path;      // the candidate that loaded (when ok)
  int version_code = 0;  // ncclGetVersion() of that library (when ok)
  std::string error;     // every candidate with why it failed, and the fix (when !ok)
};

/// Tries each candidate (dlopen + every required symbol + version check) and
/// unloads what it opened. Never throws.
MEGALITH_API NcclProbe probe_nccl(const std::vector<std::string>& candidates);

/// "2.21.5" from ncclGetVersion's code (both the pre-2.9 and the current encoding).
MEGALITH_API std::string nccl_version_string(int version_code);

/// True when NCCL loads here and this build can use it (CUDA compiled in).
/// Never throws.
MEGALITH_API bool nccl_available();

/// The loaded NCCL's version, e.g. "2.21.5". Throws megalith::error listing
/// every place tried when NCCL cannot be loaded, or saying the build has no CUDA.
MEGALITH_API std::string nccl_version();

/// A fresh ncclUniqueId (128 bytes), made on one rank and sent to all others.
MEGALITH_API std::vector<std::uint8_t> unique_id();

}  // namespace megalith::comm
