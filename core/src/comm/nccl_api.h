#pragma once
// The part of nccl.h the engine uses, declared here so the build needs no NCCL
// header, plus the function table filled by dlsym (nccl_loader.cpp).
//
// These declarations are NCCL's stable C ABI: the enums' values and the
// 128-byte unique id have not changed across NCCL 2.x (2.10+ is required for
// ncclAvg and bfloat16). When the build finds nccl.h (MEGALITH_HAS_NCCL_HEADER),
// the static_asserts at the end check them against it.

#include <cstddef>
#include <string>

namespace megalith::comm::nccl {

enum Result : int {
  success = 0,
  unhandled_cuda_error = 1,
  system_error = 2,
  internal_error = 3,
  invalid_argument = 4,
  invalid_usage = 5,
  remote_error = 6,
  in_progress = 7,
  timeout = 8,
};

enum DataType : int {
  int8 = 0,
  uint8 = 1,
  int32 = 2,
  uint32 = 3,
  int64 = 4,
  uint64 = 5,
  float16 = 6,
  float32 = 7,
  float64 = 8,
  bfloat16 = 9,
};

enum RedOp : int { sum = 0, prod = 1, max = 2, min = 3, avg = 4 };

struct UniqueId {
  char internal[128];
};

struct OpaqueComm;
using Comm = OpaqueComm*;  // ncclComm_t
using Stream = void*;      // cudaStream_t

/// ncclConfig_t as NCCL 2.14 defined it: NCCL reads `size` bytes and fills the
/// fields a newer NCCL added with their defaults, so this prefix stays valid.
struct ConfigV214 {
  std::size_t size = sizeof(ConfigV214);
  unsigned int magic = 0xcafebeef;  // NCCL_API_MAGIC
  unsigned int version = 21400;     // NCCL_VERSION(2, 14, 0)
  int blocking = -2147483647 - 1;   // NCCL_CONFIG_UNDEF_INT
  // NCCL copies `size` bytes: this field fills what would be padding, so no
  // uninitialised byte reaches it (NCCL >= 2.17 reads it as cgaClusterSize; undefined = its
  // default).
  int cga_cluster_size = -2147483647 - 1;
};
static_assert(sizeof(ConfigV214) == 24, "ncclConfig_t prefix: size, magic, version, two ints");

/// Entry points resolved from the loaded library. The optional ones may be
/// nullptr (older NCCL); every other one is present once the table is handed out.
struct Api {
  Result (*GetVersion)(int*) = nullptr;
  Result (*GetUniqueId)(UniqueId*) = nullptr;
  Result (*CommInitRank)(Comm*, int, UniqueId, int) = nullptr;
  Result (*CommInitRankConfig)(Comm*, int, UniqueId, int,
                               ConfigV214*) = nullptr;  // optional (2.14)
  Result (*CommAbort)(Comm) = nullptr;
  Result (*CommDestroy)(Comm) = nullptr;
  Result (*CommGetAsyncError)(Comm, Result*) = nullptr;
  Result (*AllReduce)(const void*, void*, std::size_t, DataType, RedOp, Comm, Stream) = nullptr;
  Result (*ReduceScatter)(const void*, void*, std::size_t, DataType, RedOp, Comm, Stream) = nullptr;
  Result (*AllGather)(const void*, void*, std::size_t, DataType, Comm, Stream) = nullptr;
  Result (*Broadcast)(const void*, void*, std::size_t, DataType, int, Comm, Stream) = nullptr;
  Result (*Reduce)(const void*, void*, std::size_t, DataType, RedOp, int, Comm, Stream) = nullptr;
  Result (*Send)(const void*, std::size_t, DataType, int, Comm, Stream) = nullptr;
  Result (*Recv)(void*, std::size_t, DataType, int, Comm, Stream) = nullptr;
  Result (*GroupStart)() = nullptr;
  Result (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(Result) = nullptr;
  const char* (*GetLastError)(Comm) = nullptr;  // optional (2.13)

  int version_code = 0;
  std::string path;
};

/// The process-wide table, loading NCCL on first use; throws megalith::error
/// listing every candidate tried and how to install NCCL.
const Api& api();

/// The table, or nullptr with *why set (never throws).
const Api* try_api(std::string* why);

/// "ncclRemoteError" for a result code.
const char* result_name(Result r);

/// "ncclRemoteError (remote process exited or there was a network error); NCCL: <last error>".
std::string explain(const Api& api, Result r);

}  // namespace megalith::comm::nccl

#if defined(MEGALITH_HAS_NCCL_HEADER) && defined(__CUDACC__)  // nccl.h needs the CUDA headers
#include <nccl.h>
static_assert(sizeof(ncclUniqueId) == sizeof(megalith::comm::nccl::UniqueId));
static_assert(NCCL_UNIQUE_ID_BYTES == 128);
static_assert(static_cast<int>(ncclInProgress) == megalith::comm::nccl::in_progress);
static_assert(static_cast<int>(ncclRemoteError) == megalith::comm::nccl::remote_error);
static_assert(static_cast<int>(ncclBfloat16) == megalith::comm::nccl::bfloat16);
static_assert(static_cast<int>(ncclFloat32) == megalith::comm::nccl::float32);
static_assert(static_cast<int>(ncclInt64) == megalith::comm::nccl::int64);
static_assert(static_cast<int>(ncclUint8) == megalith::comm::nccl::uint8);
static_assert(static_cast<int>(ncclAvg) == megalith::comm::nccl::avg);
static_assert(static_cast<int>(ncclMin) == megalith::comm::nccl::min);
static_assert(sizeof(ncclRedOp_t) == sizeof(int) && sizeof(ncclDataType_t) == sizeof(int));
#endif
