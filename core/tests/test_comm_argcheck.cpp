// The NCCL communicator's logic that needs no GPU: where NCCL is looked for,
// what the error says when it is missing, and the argument checks that run
// before any CUDA or NCCL call.

#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "harness.h"
#include "megalith/comm/argcheck.h"
#include "megalith/comm/communicator.h"
#include "megalith/comm/nccl.h"
#include "megalith/config.h"
#include "megalith/error.h"

namespace mc = megalith::comm;
using megalith::DType;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The message of the megalith::invalid_argument `fn` throws ("" when none).
template <class Fn>
std::string invalid_argument_text(Fn&& fn) {
  try {
    fn();
  } catch (const megalith::invalid_argument& e) {
    return e.what();
  }
  return "";
}

/// Sets an environment variable for a scope, restoring what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  void set(const char* value) {
    if (value) {
      setenv(name_, value, 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace

TEST(search_order_is_explicit_path_env_cuda_home_then_system) {
  char dir[] = "/tmp/megalith_nccl_XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  mc::set_nccl_search_path("/opt/wheel/nvidia/nccl/lib/");
  ScopedEnv path("MEGALITH_NCCL_PATH", dir);
  ScopedEnv cuda_home("CUDA_HOME", "/opt/cuda");
  std::vector<std::string> want = {
      "/opt/wheel/nvidia/nccl/lib/libnccl.so.2", std::string(dir) + "/libnccl.so.2",
      "/opt/cuda/lib64/libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2", "libnccl.so.2"};
  CHECK(mc::nccl_search_candidates() == want);

  // A file in MEGALITH_NCCL_PATH is used as given; an empty search path drops out;
  // CUDA_HOME=/usr/local/cuda does not repeat the default.
  path.set("/somewhere/libnccl.so.2.21.5");
  cuda_home.set("/usr/local/cuda");
  mc::set_nccl_search_path("");
  want = {"/somewhere/libnccl.so.2.21.5", "/usr/local/cuda/lib64/libnccl.so.2", "libnccl.so.2"};
  CHECK(mc::nccl_search_candidates() == want);
  rmdir(dir);
}

TEST(missing_nccl_lists_every_place_tried_and_the_fix) {
  mc::NcclProbe p = mc::probe_nccl({"/nonexistent/a/libnccl.so.2", "/nonexistent/b/libnccl.so.2"});
  CHECK(!p.ok);
  CHECK(contains(p.error, "/nonexistent/a/libnccl.so.2"));
  CHECK(contains(p.error, "/nonexistent/b/libnccl.so.2"));
  CHECK(contains(p.error, "pip install nvidia-nccl-cu13"));
  CHECK(contains(p.error, "MEGALITH_NCCL_PATH"));
  std::printf("  %s\n", p.error.c_str());
}

TEST(a_library_that_is_not_nccl_is_named_with_what_it_lacks) {
  mc::NcclProbe p = mc::probe_nccl({"libc.so.6"});
  CHECK(!p.ok);
  CHECK(contains(p.error, "libc.so.6"));
  CHECK(contains(p.error, "ncclGetVersion"));
}

TEST(probing_the_real_search_path_answers_either_way) {
  // With NCCL installed (MEGALITH_NCCL_PATH or the system) this loads it; without, it explains.
  mc::NcclProbe p = mc::probe_nccl(mc::nccl_search_candidates());
  if (p.ok) {
    CHECK(p.version_code >= mc::kMinNcclVersionCode);
    CHECK(!p.path.empty());
    std::printf("  found NCCL %s at %s\n", mc::nccl_version_string(p.version_code).c_str(),
                p.path.c_str());
  } else {
    CHECK(contains(p.error, "pip install nvidia-nccl-cu13"));
    std::printf("  no NCCL here:\n%s\n", p.error.c_str());
  }
}

TEST(version_strings) {
  CHECK(mc::nccl_version_string(23203) == "2.32.3");
  CHECK(mc::nccl_version_string(21805) == "2.18.5");
  CHECK(mc::nccl_version_string(2708) == "2.7.8");  // the encoding before 2.9
}

TEST(reduce_op_names) {
  for (mc::ReduceOp op : {mc::ReduceOp::sum, mc::ReduceOp::avg, mc::ReduceOp::min,
                          mc::ReduceOp::max, mc::ReduceOp::prod}) {
    CHECK(mc::reduce_op_from_name(mc::reduce_op_name(op)) == op);
  }
  CHECK(mc::reduce_op_from_name("mean") == mc::ReduceOp::avg);
  std::string text = invalid_argument_text([] { mc::reduce_op_from_name("xor"); });
  CHECK(contains(text, "'xor'") && contains(text, "prod"));
}

TEST(avg_is_refused_for_integers_only) {
  CHECK(mc::supports(mc::ReduceOp::avg, DType::bf16));
  CHECK(mc::supports(mc::ReduceOp::max, DType::i64));
  CHECK(!mc::supports(mc::ReduceOp::avg, DType::i32));
  std::string text = invalid_argument_text(
      [] { mc::argcheck::reduction("reduce_scatter", mc::ReduceOp::avg, DType::i64); });
  CHECK(contains(text, "reduce_scatter") && contains(text, "'avg'") && contains(text, "int64"));
}

TEST(buffers_counts_and_ranks_are_checked_with_the_op_and_argument) {
  std::string text =
      invalid_argument_text([] { mc::argcheck::buffer("all_gather", "recv", nullptr, 4096); });
  CHECK(contains(text, "all_gather") && contains(text, "recv") && contains(text, "4096"));
  text = invalid_argument_text([] {
    int x = 0;
    mc::argcheck::buffer("send", "buf", &x, -3);
  });
  CHECK(contains(text, "send") && contains(text, "-3"));
  mc::argcheck::buffer("all_reduce", "send", nullptr, 0);  // empty: no pointer needed

  text = invalid_argument_text([] { mc::argcheck::rank("broadcast", "root", 2, 2); });
  CHECK(contains(text, "broadcast") && contains(text, "root 2") && contains(text, "0..1"));
  text = invalid_argument_text([] { mc::argcheck::rank("recv", "peer", -1, 4); });
  CHECK(contains(text, "peer -1"));
}

TEST(all_to_allv_splits) {
  std::vector<std::int64_t> counts = {3, 0, 2}, displs = {0, 3, 5};
  CHECK(mc::argcheck::splits("all_to_allv", "send_counts", counts, "send_displs", displs, 3) == 7);
  std::vector<std::int64_t> empty = {0, 0, 0};
  CHECK(mc::argcheck::splits("all_to_allv", "c", empty, "d", empty, 3) == 0);
  std::string text = invalid_argument_text([&] {
    mc::argcheck::splits("all_to_allv", "send_counts", counts, "send_displs", displs, 4);
  });
  CHECK(contains(text, "send_counts") && contains(text, "(4)") && contains(text, "got 3"));
  std::vector<std::int64_t> negative = {1, -2, 0};
  text = invalid_argument_text([&] {
    mc::argcheck::splits("all_to_allv", "recv_counts", negative, "recv_displs", displs, 3);
  });
  CHECK(contains(text, "recv_counts[1]") && contains(text, "-2"));
}

TEST(constructor_arguments_fail_before_cuda_or_nccl) {
  std::vector<std::uint8_t> id(mc::kUniqueIdBytes, 0);
  std::string text =
      invalid_argument_text([] { mc::Communicator(std::vector<std::uint8_t>(10), 2, 0, 0); });
  CHECK(contains(text, "128") && contains(text, "10 bytes"));
  text = invalid_argument_text([&] { mc::Communicator(id, 2, 2, 0); });
  CHECK(contains(text, "rank 2") && contains(text, "world_size 2"));
  text = invalid_argument_text([&] { mc::Communicator(id, 1, 0, 0, mc::Options{0.0, "dp"}); });
  CHECK(contains(text, "timeout_s"));
}

#if !MEGALITH_HAS_CUDA
TEST(a_build_without_cuda_says_so) {
  CHECK(!mc::nccl_available());
  try {
    mc::nccl_version();
    CHECK(false);
  } catch (const megalith::error& e) {
    CHECK(contains(e.what(), "built without CUDA"));
  }
  std::vector<std::uint8_t> id(mc::kUniqueIdBytes, 0);
  try {
    mc::Communicator comm(id, 1, 0, 0);
    CHECK(false);
  } catch (const megalith::error& e) {
    CHECK(contains(e.what(), "built without CUDA"));
  }
}
#endif

MEGALITH_TEST_MAIN()
