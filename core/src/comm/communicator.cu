// Communicator: creation (with a timeout), destruction, groups, abort.
// The operations are in collectives.cu.

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "../cuda/cuda_check.cuh"
#include "communicator_impl.h"
#include "megalith/comm/argcheck.h"
#include "megalith/comm/nccl.h"
#include "megalith/cuda/device.h"
#include "megalith/error.h"

namespace megalith::comm {
namespace {

using detail::Clock;

std::atomic<int> g_unnamed{0};

// [Note: non-blocking NCCL]
// With ncclCommInitRankConfig (NCCL >= 2.14) the communicator is created
// non-blocking: init and the first use of a connection run on NCCL's threads
// and the host polls ncclCommGetAsyncError, so a rank that never joins (or
// never makes the matching call) is a timeout with a message, not a host
// thread stuck inside NCCL forever. MEGALITH_NCCL_BLOCKING=1 asks for NCCL's
// blocking mode instead, =0 for non-blocking; unset gives kBlockingByDefault.
// Blocking init cannot time out inside NCCL (the store's unique-id exchange
// before it still does); the watchdog covers operations in both modes.
// Blocking is the default: on two H200s non-blocking mode put NCCL's enqueue
// on its own thread and small all_reduces took ~100 us against ~27 us blocking
// (torch: ~43 us), benchmarks/results/comm_gpu/2026-11-29_h200x2_world2_blocking*.
constexpr bool kBlockingByDefault = true;  // non-blocking cost ~3x latency at 2 GPUs (benchmarks/results)

bool want_nonblocking(const nccl::Api& api) {
  const char* env = std::getenv("MEGALITH_NCCL_BLOCKING");
  bool blocking = env && *env ? std::strcmp(env, "0") != 0 : kBlockingByDefault;
  return api.CommInitRankConfig != nullptr && !blocking;
}

std::string init_context(const detail::CommState& s) {
  return "communicator " + s.label() + ", device " + std::to_string(s.device) + ")";
}

constexpr const char* kInitHint =
    "every rank must create it with the same unique id and world size, each with its own rank";

/// Creates the NCCL communicator and waits until it is ready (or times out).
nccl::Comm init_nccl(const detail::CommState& s, const std::vector<std::uint8_t>& unique_id) {
  const nccl::Api& api = *s.api;
  nccl::UniqueId id{};
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  nccl::Comm c = nullptr;
  const auto since = Clock::now();
  nccl::Result r;
  if (s.nonblocking) {
    nccl::ConfigV214 config;
    config.blocking = 0;
    r = api.CommInitRankConfig(&c, s.size, id, s.rank, &config);
  } else {
    r = api.CommInitRank(&c, s.size, id, s.rank);
  }
  for (int iteration = 0; r == nccl::in_progress && c; detail::backoff(iteration)) {
    if (detail::seconds_since(since) > s.timeout_s) {
      (void)api.CommAbort(c);
      char waited[32];
      std::snprintf(waited, sizeof(waited), "%.1f", s.timeout_s);
      MEGALITH_FAIL(error, "megalith NCCL: creating ", init_context(s), " did not finish within ",
                    waited, " s: ", kInitHint,
                    "; the missing ranks may not have started it, or died. Aborted.");
    }
    nccl::Result state = nccl::success;
    nccl::Result q = api.CommGetAsyncError(c, &state);
    r = q == nccl::success ? state : q;
  }
  if (r != nccl::success) {
    if (c) (void)api.CommAbort(c);
    MEGALITH_FAIL(error, "megalith NCCL: creating ", init_context(s),
                  " failed: ", nccl::explain(api, r), " (", kInitHint,
                  "; NCCL_DEBUG=WARN shows NCCL's reason)");
  }
  return c;
}

}  // namespace

Communicator::Communicator(const std::vector<std::uint8_t>& unique_id, int world_size, int rank,
                           int device, Options options) {
  argcheck::init(unique_id.size(), world_size, rank, device, options.timeout_s);
  const nccl::Api& api = nccl::api();
  const int devices = cuda::device_count();
  MEGALITH_EXPECTS(device < devices, invalid_argument, "Communicator: device ", device,
                   " does not exist: this process sees ", devices, " CUDA device(s) (",
                   cuda::status(), ")");

  auto state = std::make_shared<detail::CommState>();
  state->name = options.name.empty() ? "comm" + std::to_string(g_unnamed++) : options.name;
  state->rank = rank;
  state->size = world_size;
  state->device = device;
  state->timeout_s = options.timeout_s;
  state->api = &api;
  state->nonblocking = want_nonblocking(api);

  detail::DeviceGuard guard(device);
  MEGALITH_CUDA_TRY(cudaFree(nullptr));  // the device's context exists before NCCL looks for it
  state->comm.store(init_nccl(*state, unique_id));

  impl_ = std::make_unique<Impl>();
  impl_->state = state;
  impl_->pool = std::make_shared<detail::EventPool>();
  impl_->watchdog = std::make_unique<detail::Watchdog>(state);
}

namespace {

/// Waits (the watchdog still running) until every issued op finished or the
/// communicator failed; a peer that never comes ends it at timeout_s.
void drain(detail::CommState& s) {
  for (int iteration = 0; !s.failed.load(); detail::backoff(iteration)) {
    std::lock_guard<std::mutex> lock(s.works_mu);
    bool all_done = true;
    for (auto& w : s.outstanding) {
      try {
        all_done = all_done && w->query();
      } catch (...) {
        return;  // a CUDA error: the check below aborts
      }
    }
    if (all_done) return;
  }
}

}  // namespace

Communicator::~Communicator() {
  if (!impl_) return;
  detail::CommState& s = *impl_->state;
  drain(s);                 // operations issued but not waited for still finish
  impl_->watchdog.reset();  // joins the thread

  std::string unfinished;
  {
    std::lock_guard<std::mutex> lock(s.works_mu);
    for (auto& w : s.outstanding) {
      bool done = false;
      try {
        done = w->query();
      } catch (...) {
      }
      if (!done) {
        unfinished = s.describe(w->info());
        break;
      }
    }
    if (unfinished.empty() && !s.group_pending.empty()) {
      unfinished = s.describe(s.group_pending.front()->info()) + " (in a group never ended)";
    }
  }
  if (!unfinished.empty()) {
    // (failed, or a group never ended) Destroying would wait for peers that may never come.
    s.fail("megalith NCCL: communicator " + s.label() + ") was destroyed with unfinished work (" +
           unfinished + "); NCCL aborted.");
  } else if (nccl::Comm c = s.comm.exchange(nullptr)) {
    int previous = -1;
    if (cudaGetDevice(&previous) == cudaSuccess && previous != s.device)
      (void)cudaSetDevice(s.device);
    (void)s.api->CommDestroy(c);
    if (previous >= 0 && previous != s.device) (void)cudaSetDevice(previous);
  }
  if (impl_->barrier_buffer) (void)cudaFree(impl_->barrier_buffer);
}

void Communicator::group_start() {
  impl_->state->raise_if_failed();
  detail::OpInfo info{"group_start"};
  info.group_ops = 0;
  const auto since = Clock::now();
  impl_->state->check(impl_->state->api->GroupStart(), info, since, false);
  ++impl_->group_depth;
}

void Communicator::group_end() {
  detail::CommState& s = *impl_->state;
  MEGALITH_EXPECTS(impl_->group_depth > 0, invalid_argument,
                   "group_end: no group_start() is open on communicator ", s.label(), ")");
  --impl_->group_depth;
  detail::OpInfo info{"group_end"};
  {
    std::lock_guard<std::mutex> lock(s.works_mu);
    info.group_ops = static_cast<int>(s.group_pending.size());
  }
  const bool outermost = impl_->group_depth == 0;
  const auto since = Clock::now();
  detail::DeviceGuard guard(s.device);
  try {
    nccl::Result r = s.call(info, [&](nccl::Comm) { return s.api->GroupEnd(); });
    s.check(r, info, since, outermost);
  } catch (...) {
    if (outermost) {
      std::lock_guard<std::mutex> lock(s.works_mu);
      for (auto& w : s.group_pending) w->mark_failed();
      s.group_pending.clear();
    }
    throw;
  }
  if (!outermost) return;
  std::lock_guard<std::mutex> lock(s.works_mu);
  for (auto& w : s.group_pending) {
    w->record();
    s.outstanding.push_back(w);
  }
  s.group_pending.clear();
}

void Communicator::abort() {
  detail::CommState& s = *impl_->state;
  s.fail("megalith NCCL: communicator " + s.label() +
         ") was aborted on this rank (abort() was called); create a new communicator to go on.");
}

std::optional<std::string> Communicator::error() const {
  if (!impl_->state->failed.load()) return std::nullopt;
  return impl_->state->error_text();
}

int Communicator::rank() const { return impl_->state->rank; }
int Communicator::size() const { return impl_->state->size; }
int Communicator::device() const { return impl_->state->device; }
const std::string& Communicator::name() const { return impl_->state->name; }
double Communicator::timeout_s() const { return impl_->state->timeout_s; }

}  // namespace megalith::comm
