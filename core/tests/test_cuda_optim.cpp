// CUDA optimizer steps against a double-precision host reference, with
// torch.optim's semantics. Every case runs a few steps on fresh random
// gradients over single tensors of awkward sizes and over a list of ~330
// tensors of mixed sizes (two launch groups; empty slots; sub-buffers at odd
// offsets, which take the scalar path), for every gradient dtype and copy
// dtype. Skips (exit 77) on machines without a CUDA device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_optim_problem.h"
#include "cuda_test_support.h"
#include "harness.h"
#include "megalith/cuda/device.h"
#include "megalith/cuda/optim.h"
#include "megalith/error.h"

using namespace megalith_cuda_test;

namespace {

const DType kCopyTypes[] = {DType::bf16, DType::f16, DType::f32};

Config adamw() {
  Config c;
  c.name = "AdamW";
  c.adam.lr = 1e-2f;
  c.adam.beta1 = 0.9f;
  c.adam.beta2 = 0.95f;
  c.adam.eps = 1e-3f;  // large enough that a missing or misplaced eps shows
  c.adam.weight_decay = 0.1f;
  return c;
}

std::string dtypes_tag(const Config& c) {
  return std::string(" grad=") + dtype_name(c.grad) +
         (c.copies ? std::string(" copy=") + dtype_name(c.copy) : std::string(" no copy"));
}

/// Every grad dtype x copy dtype (and no copy) on the mixed list.
void all_dtypes(Config c) {
  for (DType g : kGradTypes) {
    c.grad = g;
    c.copies = false;
    run(c, mixed_list(), dtypes_tag(c));
    c.copies = true;
    for (DType cp : kCopyTypes) {
      c.copy = cp;
      run(c, mixed_list(), dtypes_tag(c));
    }
  }
}

// ------------------------------------------------------------------- tests

TEST(device_reports) {
  CHECK(megalith::cuda::compiled());
  const int n = megalith::cuda::device_count();
  const std::string s = megalith::cuda::status();
  std::printf("  cuda status: %s\n", s.c_str());
  if (n > 0) {
    CHECK(s.rfind(std::to_string(n) + " device(s): ", 0) == 0);
    CHECK(s.find("(sm_") != std::string::npos);
  } else {
    CHECK(s.rfind("no ", 0) == 0);
  }
  require_gpu();
}

TEST(adamw_single_tensor_sizes) {
  require_gpu();
  Config c = adamw();
  for (std::int64_t n :
       {std::int64_t{1}, std::int64_t{7}, std::int64_t{1023}, std::int64_t{(1 << 20) + 3}}) {
    run(c, single(n), " n=" + std::to_string(n));
    run(c, single(n, 63), " misaligned n=" + std::to_string(n));
  }
  c.steps = 5;
  c.grad = DType::bf16;
  run(c, single((1 << 20) + 3), " 5 steps bf16 grads");
}

TEST(adamw_every_dtype_mixed_list) {
  require_gpu();
  all_dtypes(adamw());
}

TEST(adam_options) {
  require_gpu();
  Config c = adamw();
  c.name = "Adam L2";
  c.adam.decoupled_weight_decay = false;
  c.adam.weight_decay = 0.05f;
  c.grad = DType::bf16;
  run(c, mixed_list());

  c = adamw();
  c.name = "AdamW amsgrad";
  c.adam.amsgrad = true;
  c.steps = 4;
  all_dtypes(c);

  c = adamw();
  c.name = "Adam L2 amsgrad maximize";
  c.adam.amsgrad = true;
  c.adam.decoupled_weight_decay = false;
  c.adam.maximize = true;
  c.grad = DType::f16;
  c.copy = DType::f16;
  run(c, mixed_list());

  c = adamw();
  c.name = "AdamW no bias correction";
  c.adam.bias_correction = false;
  c.copy = DType::f32;
  run(c, mixed_list());

  c = adamw();
  c.name = "AdamW maximize";
  c.adam.maximize = true;
  run(c, mixed_list());

  c = adamw();
  c.name = "Adam wd=0 eps=1e-8 torch defaults";
  c.adam = AdamHyper{};
  c.adam.weight_decay = 0.0f;
  c.steps = 4;
  run(c, mixed_list());
  run(c, single((1 << 20) + 3));

  c = adamw();
  c.name = "AdamW late step";  // bias corrections near 1
  c.steps = 2;
  {
    Problem pb(c, mixed_list());
    pb.step(1000);
    pb.step(1001);
    pb.verify();
  }
}

TEST(sgd_variants) {
  require_gpu();
  Config base;
  base.kind = Kind::sgd;
  base.sgd.lr = 0.05f;

  Config c = base;
  c.name = "SGD plain";
  all_dtypes(c);

  c = base;
  c.name = "SGD momentum dampening wd";
  c.sgd.momentum = 0.9f;
  c.sgd.dampening = 0.1f;
  c.sgd.weight_decay = 0.01f;
  c.steps = 4;
  all_dtypes(c);

  c = base;
  c.name = "SGD nesterov wd";
  c.sgd.momentum = 0.8f;
  c.sgd.nesterov = true;
  c.sgd.weight_decay = 0.02f;
  c.grad = DType::bf16;
  run(c, mixed_list());
  run(c, single((1 << 20) + 3, 2));

  c = base;
  c.name = "SGD momentum maximize";
  c.sgd.momentum = 0.5f;
  c.sgd.maximize = true;
  c.grad = DType::f16;
  c.copy = DType::f16;
  run(c, mixed_list());

  c = base;
  c.name = "SGD wd maximize no momentum";
  c.sgd.weight_decay = 0.1f;
  c.sgd.maximize = true;
  run(c, single(1023));
}

TEST(sgd_momentum_buffer_starts_at_step_one_only) {
  require_gpu();
  // Step 3 first: the (garbage) buffer must be used, not overwritten.
  Config c;
  c.kind = Kind::sgd;
  c.name = "SGD resumed at step 3";
  c.sgd.lr = 0.05f;
  c.sgd.momentum = 0.9f;
  c.sgd.dampening = 0.25f;
  Problem pb(c, mixed_list());
  pb.step(3);
  pb.step(4);
  pb.verify();
}

TEST(lion_variants) {
  require_gpu();
  Config c;
  c.kind = Kind::lion;
  c.name = "Lion";
  c.lion.lr = 1e-3f;
  c.lion.weight_decay = 0.1f;
  c.steps = 4;
  all_dtypes(c);

  c.name = "Lion maximize";
  c.lion.maximize = true;
  c.lion.beta1 = 0.95f;
  c.lion.beta2 = 0.98f;
  c.grad = DType::bf16;
  run(c, mixed_list());
  run(c, single((1 << 20) + 3));
}

TEST(found_inf_skips_the_step) {
  require_gpu();
  Config a = adamw();
  a.adam.amsgrad = true;
  Config s;
  s.kind = Kind::sgd;
  s.sgd.momentum = 0.9f;
  s.sgd.lr = 0.1f;
  Config l;
  l.kind = Kind::lion;
  l.lion.weight_decay = 0.1f;
  for (Config c : {a, s, l}) {
    c.name = std::string(kind_name(c.kind)) + " found_inf";
    c.grad = DType::f16;
    Problem pb(c, mixed_list());
    pb.step(1);
    const auto before = pb.snapshot();
    pb.step(2, /*skip=*/true);
    const auto after = pb.snapshot();
    CHECK(before == after);
    pb.step(2);  // the same step number again, now taken
    pb.verify();
  }
  {
    // A skipped first step leaves the copies untouched (still the 0xff fill).
    Config c = adamw();
    c.name = "AdamW found_inf at step 1";
    Problem pb(c, single(4099));
    const auto before = pb.snapshot();
    pb.step(1, /*skip=*/true);
    CHECK(before == pb.snapshot());
    pb.step(1);
    pb.verify();
  }
}

TEST(inv_scale_grad_scale_and_clipping) {
  require_gpu();
  for (Kind kind : {Kind::adam, Kind::sgd, Kind::lion}) {
    Config c = adamw();
    c.kind = kind;
    c.sgd.lr = 0.05f;
    c.sgd.momentum = 0.9f;
    c.name = std::string(kind_name(kind)) + " inv_scale 1/1024, grad_scale 0.5, f16";
    c.grad = DType::f16;
    c.grad_std = 1024.0f;  // as a loss-scaled fp16 gradient
    c.inv_scale = 1.0f / 1024.0f;
    c.grad_scale = 0.5f;
    run(c, mixed_list());

    c.name = std::string(kind_name(kind)) + " clipped (active)";
    c.max_norm = 10.0f;  // sum of ~7e5 unit gradients: norm ~420, so clip ~0.05
    run(c, mixed_list());

    c.name = std::string(kind_name(kind)) + " clipped (inactive)";
    c.max_norm = 1e6f;
    c.grad = DType::f32;
    run(c, mixed_list());
  }
}

TEST(own_stream) {
  require_gpu();
  Config c = adamw();
  c.name = "AdamW on a created stream";
  c.own_stream = true;
  run(c, mixed_list());
}

TEST(invalid_arguments_are_named) {
  require_gpu();
  Config c = adamw();
  c.adam.amsgrad = true;
  Problem pb(c, mixed_list());
  pb.step(1);  // real gradients in the buffers: the valid calls below do run
  std::vector<ParamSlots> slots = pb.slots();
  const AdamHyper h = c.adam;
  StepArgs args;
  gpu::DeviceScalars dev;
  auto adam = [&](const std::vector<ParamSlots>& s, const AdamHyper& hh, const StepArgs& a,
                  const gpu::DeviceScalars& d) {
    gpu::adam_step(s.data(), s.size(), hh, a, d, nullptr);
  };

  auto bad = slots;
  bad[3].state[1] = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 3: exp_avg_sq (state[1]) is null");
  bad = slots;
  bad[5].state[2] = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 5: max_exp_avg_sq (state[2])");
  bad = slots;
  bad[2].param = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 2: param is null");
  bad = slots;
  bad[4].grad = nullptr;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 4: grad is null");
  bad = slots;
  bad[6].numel = -5;
  expect_throw_with([&] { adam(bad, h, args, dev); }, "slot 6: numel is -5");
  bad = slots;
  bad[8] = ParamSlots{};  // an empty slot needs no buffers
  adam(bad, h, args, dev);
  CUDA_OK(cudaDeviceSynchronize());

  StepArgs a2 = args;
  a2.nonfinite = NonFinite::skip;
  expect_throw_with([&] { adam(slots, h, a2, dev); }, "grad_check");
  a2 = args;
  a2.step = 0;
  expect_throw_with([&] { adam(slots, h, a2, dev); }, "step is 0");
  a2 = args;
  a2.grad_dtype = DType::i32;
  CHECK_THROWS(adam(slots, h, a2, dev), megalith::type_error);
  a2 = args;
  a2.copy_dtype = DType::f64;
  CHECK_THROWS(adam(slots, h, a2, dev), megalith::type_error);
  gpu::DeviceScalars d2;
  d2.max_grad_norm = 1.0f;
  expect_throw_with([&] { adam(slots, h, args, d2); }, "grad_sum_sq is null");
  ParamSlots* none = nullptr;
  expect_throw_with([&] { gpu::adam_step(none, 3, h, args, dev, nullptr); }, "slots is null");

  SgdHyper sh;
  sh.momentum = 0.9f;
  bad = slots;
  bad[11].state[0] = nullptr;
  expect_throw_with([&] { gpu::sgd_step(bad.data(), bad.size(), sh, args, dev, nullptr); },
                    "slot 11: momentum_buffer (state[0]) is null");
  sh.momentum = 0.0f;  // no buffer needed then
  gpu::sgd_step(bad.data(), bad.size(), sh, args, dev, nullptr);
  sh.nesterov = true;
  expect_throw_with([&] { gpu::sgd_step(slots.data(), slots.size(), sh, args, dev, nullptr); },
                    "nesterov");
  LionHyper lh;
  bad = slots;
  bad[9].state[0] = nullptr;
  expect_throw_with([&] { gpu::lion_step(bad.data(), bad.size(), lh, args, dev, nullptr); },
                    "slot 9: exp_avg (state[0]) is null");
  CUDA_OK(cudaDeviceSynchronize());

  float* f = nullptr;
  std::int64_t n = 4;
  void* g = slots[0].param;
  expect_throw_with(
      [&] { gpu::grad_check(&g, &n, 1, DType::f32, nullptr, false, f, nullptr, nullptr); },
      "found_inf is null");
  DevFloat flag(0.0f);
  CHECK_THROWS(gpu::grad_check(&g, &n, 1, DType::i8, nullptr, false, flag.p, nullptr, nullptr),
               megalith::type_error);
}

TEST(grad_check_flag_skips_the_next_step) {
  require_gpu();
  // The intended pipeline: grad_check -> adam_step reading found_inf and
  // grad_sum_sq on the device, with no host sync in between. An inf that
  // grad_check finds must leave every buffer of the step untouched.
  Config c = adamw();
  c.name = "grad_check -> AdamW";
  c.grad = DType::bf16;
  Problem pb(c, mixed_list());
  std::vector<void*> grads;
  std::vector<std::int64_t> numels;
  for (auto& s : pb.slots()) {
    grads.push_back(const_cast<void*>(s.grad));
    numels.push_back(s.numel);
  }
  pb.step(1);
  std::vector<float> inf = {std::numeric_limits<float>::infinity()};
  auto bytes = encode(inf, DType::bf16);
  CUDA_OK(cudaMemcpy(grads[10], bytes.data(), 2, cudaMemcpyHostToDevice));
  DevFloat found(0.0f), sum(0.0f);
  gpu::grad_check(grads.data(), numels.data(), grads.size(), DType::bf16, nullptr, false, found.p,
                  sum.p, nullptr);
  gpu::DeviceScalars dev;
  dev.found_inf = found.p;
  dev.grad_sum_sq = sum.p;
  dev.max_grad_norm = 1.0f;
  StepArgs args;
  args.grad_dtype = DType::bf16;
  args.step = 2;
  const auto before = pb.snapshot();
  gpu::adam_step(pb.slots().data(), pb.slots().size(), c.adam, args, dev, nullptr);
  CUDA_OK(cudaDeviceSynchronize());
  CHECK(found.get() == 1.0f);
  CHECK(before == pb.snapshot());
}

}  // namespace

MEGALITH_TEST_MAIN()
