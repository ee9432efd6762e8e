// The NCCL communicator of a build without CUDA: the entry points exist (so
// the bindings and embedders link) and say how to get a build that has it.

#include <string>
#include <vector>

#include "megalith/comm/argcheck.h"
#include "megalith/comm/communicator.h"
#include "megalith/comm/nccl.h"
#include "megalith/error.h"

namespace megalith::comm {
namespace {
[[noreturn]] void compiled_out(const char* what) {
  MEGALITH_FAIL(::megalith::error, what,
                ": megalith was built without CUDA, and NCCL needs it (reinstall with nvcc on "
                "PATH, or MEGALITH_CUDA=ON)");
}
}  // namespace

bool nccl_available() { return false; }
std::string nccl_version() { compiled_out("nccl_version"); }
std::vector<std::uint8_t> unique_id() { compiled_out("nccl_unique_id"); }

struct Communicator::Impl {};

Communicator::Communicator(const std::vector<std::uint8_t>& unique_id, int world_size, int rank,
                           int device, Options options) {
  argcheck::init(unique_id.size(), world_size, rank, device, options.timeout_s);
  compiled_out("NcclCommunicator");
}
Communicator::~Communicator() = default;

using WorkPtr = Communicator::WorkPtr;
WorkPtr Communicator::all_reduce(const void*, void*, std::int64_t, DType, ReduceOp, void*) {
  compiled_out("all_reduce");
}
WorkPtr Communicator::reduce_scatter(const void*, void*, std::int64_t, DType, ReduceOp, void*) {
  compiled_out("reduce_scatter");
}
WorkPtr Communicator::all_gather(const void*, void*, std::int64_t, DType, void*) {
  compiled_out("all_gather");
}
WorkPtr Communicator::broadcast(void*, std::int64_t, DType, int, void*) {
  compiled_out("broadcast");
}
WorkPtr Communicator::reduce(const void*, void*, std::int64_t, DType, ReduceOp, int, void*) {
  compiled_out("reduce");
}
WorkPtr Communicator::send(const void*, std::int64_t, DType, int, void*) { compiled_out("send"); }
WorkPtr Communicator::recv(void*, std::int64_t, DType, int, void*) { compiled_out("recv"); }
WorkPtr Communicator::all_to_all(const void*, void*, std::int64_t, DType, void*) {
  compiled_out("all_to_all");
}
WorkPtr Communicator::all_to_allv(const void*, const std::vector<std::int64_t>&,
                                  const std::vector<std::int64_t>&, void*,
                                  const std::vector<std::int64_t>&,
                                  const std::vector<std::int64_t>&, DType, void*) {
  compiled_out("all_to_allv");
}
WorkPtr Communicator::barrier(void*) { compiled_out("barrier"); }
void Communicator::group_start() { compiled_out("group_start"); }
void Communicator::group_end() { compiled_out("group_end"); }
void Communicator::abort() { compiled_out("abort"); }
std::optional<std::string> Communicator::error() const { compiled_out("error"); }
int Communicator::rank() const { compiled_out("rank"); }
int Communicator::size() const { compiled_out("size"); }
int Communicator::device() const { compiled_out("device"); }
const std::string& Communicator::name() const { compiled_out("name"); }
double Communicator::timeout_s() const { compiled_out("timeout_s"); }

}  // namespace megalith::comm
