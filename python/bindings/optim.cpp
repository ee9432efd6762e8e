// Optimizer steps. Two entry points per optimizer:
//  - *_step_flat(param, grad, states..., param_copy=None, ...): the safe API on
//    DLPack arrays (torch, numpy, ...), fully validated; CPU or CUDA by the
//    arrays' device.
//  - cpu_*_step / cuda_*_step(slots, numels, ...): the hot path used by
//    megalith.optim. [Note: pointer tables] converting hundreds of tensors
//    through DLPack costs milliseconds a step, so megalith.optim validates each
//    tensor once in Python and passes an int64 table of data pointers, one row
//    per parameter: [param, grad, state0, state1, state2, param_copy] (0 = none),
//    or with lean Adam states (StepArgs.state_format / master_format) nine
//    columns: [..., param_copy, scale0, scale1, param_comp].
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "buffers.h"
#include "megalith/error.h"
#include "megalith/optim/cpu.h"
#include "megalith/optim/hyper.h"
#include "megalith/optim/slots.h"
#include "megalith/cuda/optim.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace megalith::bindings {
namespace {

using optim::AdamHyper;
using optim::LionHyper;
using optim::MasterFormat;
using optim::StateFormat;
using optim::NonFinite;
using optim::ParamSlots;
using optim::SgdHyper;
using optim::StepArgs;

using PointerTable = nb::ndarray<const std::int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Int64Vector = nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using OptArray = std::optional<nb::ndarray<>>;

/// Device-side scalars as integers (data pointers), converted for the core.
struct PyDeviceScalars {
  std::uintptr_t inv_scale = 0, found_inf = 0, grad_sum_sq = 0;
  float max_grad_norm = 0.0f;
  optim::cuda::DeviceScalars to_core() const {
    return {reinterpret_cast<const float*>(inv_scale), reinterpret_cast<const float*>(found_inf),
            reinterpret_cast<const float*>(grad_sum_sq), max_grad_norm};
  }
};

std::vector<ParamSlots> slots_from_table(const PointerTable& table, const Int64Vector& numels) {
  const std::size_t cols = table.shape(1);
  MEGALITH_EXPECTS(cols == 6 || cols == 9, invalid_argument,
                   "slots: expected shape (n, 6) [param, grad, state0, state1, state2, param_copy] "
                   "or (n, 9) [..., param_copy, scale0, scale1, param_comp], got (",
                   table.shape(0), ", ", cols, ")");
  MEGALITH_EXPECTS(table.shape(0) == numels.shape(0), invalid_argument, "numels: expected ",
                   table.shape(0), " entries (one per slot row), got ", numels.shape(0));
  std::vector<ParamSlots> out(table.shape(0));
  const std::int64_t* row = table.data();
  auto ptr = [](std::int64_t v) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(v)); };
  for (std::size_t i = 0; i < out.size(); ++i, row += cols) {
    out[i].param = static_cast<float*>(ptr(row[0]));
    out[i].grad = ptr(row[1]);
    for (int k = 0; k < 3; ++k) out[i].state[k] = static_cast<float*>(ptr(row[2 + k]));
    out[i].param_copy = ptr(row[5]);
    out[i].numel = numels.data()[i];
    if (cols == 9) {
      out[i].state_scale[0] = static_cast<float*>(ptr(row[6]));
      out[i].state_scale[1] = static_cast<float*>(ptr(row[7]));
      out[i].param_comp = ptr(row[8]);
    }
  }
  return out;
}

std::vector<void*> pointers_from_vector(const Int64Vector& v) {
  std::vector<void*> out(v.shape(0));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = reinterpret_cast<void*>(static_cast<std::uintptr_t>(v.data()[i]));
  }
  return out;
}

/// One validated parameter from DLPack arrays: its slot, and where it lives.
struct FlatParam {
  ParamSlots slot;
  StepArgs args;
  bool on_cuda = false;
};

FlatParam flat_param(const nb::ndarray<>& param, const nb::ndarray<>& grad,
                     std::initializer_list<std::pair<const char*, const OptArray*>> states,
                     const OptArray& copy, std::int64_t step, float grad_scale,
                     NonFinite nonfinite, std::initializer_list<DType> param_types = {DType::f32},
                     std::initializer_list<DType> state_types = {DType::f32}) {
  std::vector<Buffer> bufs{as_buffer(param, "param", param_types),
                           as_buffer(grad, "grad", {DType::f32, DType::bf16, DType::f16})};
  FlatParam out;
  int k = 0;
  for (auto [name, arr] : states) {
    if (arr->has_value()) {
      bufs.push_back(as_buffer(**arr, name, state_types));
      out.slot.state[k] = static_cast<float*>(bufs.back().ptr);
    }
    ++k;
  }
  if (copy) {
    bufs.push_back(as_buffer(*copy, "param_copy", {DType::bf16, DType::f16, DType::f32}));
    out.slot.param_copy = bufs.back().ptr;
    out.args.copy_dtype = bufs.back().dtype;
  }
  check_same_layout(bufs);
  out.slot.param = static_cast<float*>(bufs[0].ptr);
  out.slot.grad = bufs[1].ptr;
  out.slot.numel = bufs[0].numel;
  out.args.grad_dtype = bufs[1].dtype;
  out.args.step = step;
  out.args.grad_scale = grad_scale;
  out.args.nonfinite = nonfinite;
  out.on_cuda = bufs[0].device_type == nb::device::cuda::value;
  return out;
}

DType dtype_of(const nb::ndarray<>& a, const char* name) {
  return as_buffer(a, name, {DType::f32, DType::bf16, DType::f16, DType::i8, DType::u8}).dtype;
}

/// adam_step_flat's lean formats, chosen by the dtypes ([Note: lean states]):
/// bf16 exp_avg/exp_avg_sq, or int8/uint8 codes with fp32 block scales; a bf16
/// param is a Kahan master with its bf16 param_comp.
void add_lean_formats(FlatParam& fp, const nb::ndarray<>& param, const nb::ndarray<>& exp_avg,
                      const nb::ndarray<>& exp_avg_sq, const OptArray& exp_avg_scale,
                      const OptArray& exp_avg_sq_scale, const OptArray& param_comp,
                      std::uint64_t seed) {
  const DType m = dtype_of(exp_avg, "exp_avg"), v = dtype_of(exp_avg_sq, "exp_avg_sq");
  const bool q8 = m == DType::i8;
  MEGALITH_EXPECTS(q8 ? v == DType::u8 : v == m, type_error, "exp_avg_sq: ", dtype_name(v),
                   " does not go with exp_avg ", dtype_name(m),
                   "; expected both float32, both bfloat16, or int8 exp_avg with uint8 exp_avg_sq");
  MEGALITH_EXPECTS(m != DType::u8 && v != DType::i8, type_error,
                   "exp_avg must be the int8 codes and exp_avg_sq the uint8 ones");
  fp.args.state_format = q8 ? StateFormat::q8 : (m == DType::bf16 ? StateFormat::bf16 : StateFormat::f32);
  fp.args.seed = seed;
  std::vector<Buffer> extra;
  if (q8) {
    MEGALITH_EXPECTS(exp_avg_scale && exp_avg_sq_scale, invalid_argument,
                     "exp_avg_scale, exp_avg_sq_scale: required with int8/uint8 codes (",
                     optim::q8_scale_count(fp.slot.numel), " float32 block scales each)");
    for (auto [name, arr, k] : {std::tuple{"exp_avg_scale", &exp_avg_scale, 0},
                                std::tuple{"exp_avg_sq_scale", &exp_avg_sq_scale, 1}}) {
      Buffer b = as_buffer(**arr, name, {DType::f32});
      MEGALITH_EXPECTS(b.numel == optim::q8_scale_count(fp.slot.numel), invalid_argument, name,
                       ": has ", b.numel, " elements; expected ceil(", fp.slot.numel, " / ",
                       optim::kQ8Block, ") = ", optim::q8_scale_count(fp.slot.numel));
      MEGALITH_EXPECTS((b.device_type == nb::device::cuda::value) == fp.on_cuda, invalid_argument,
                       name, ": on another device than param");
      fp.slot.state_scale[k] = static_cast<float*>(b.ptr);
    }
  }
  if (dtype_of(param, "param") == DType::bf16) {
    MEGALITH_EXPECTS(param_comp.has_value(), invalid_argument,
                     "param_comp: required with a bfloat16 param (the Kahan compensation)");
    std::vector<Buffer> pair{as_buffer(param, "param", {DType::bf16}),
                             as_buffer(*param_comp, "param_comp", {DType::bf16})};
    check_same_layout(pair);
    fp.slot.param_comp = pair[1].ptr;
    fp.args.master_format = MasterFormat::bf16_kahan;
  }
}

template <class Hyper, class CpuFn, class CudaFn>
bool run_flat(const FlatParam& fp, const Hyper& h, std::uintptr_t stream, CpuFn cpu_fn,
              CudaFn cuda_fn) {
  nb::gil_scoped_release release;
  if (fp.on_cuda) {
    cuda_fn(&fp.slot, 1, h, fp.args, optim::cuda::DeviceScalars{}, reinterpret_cast<void*>(stream));
    return false;
  }
  return cpu_fn(&fp.slot, 1, h, fp.args).found_nonfinite;
}

void bind_types(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element type of a buffer")
      .value("f32", DType::f32)
      .value("f16", DType::f16)
      .value("bf16", DType::bf16)
      .value("f64", DType::f64)
      .value("i8", DType::i8)
      .value("u8", DType::u8)
      .value("i32", DType::i32)
      .value("i64", DType::i64);
  nb::enum_<NonFinite>(m, "NonFinite", "What a step does about inf/nan gradients")
      .value("ignore", NonFinite::ignore, "no check")
      .value("detect", NonFinite::detect, "fused check; the step runs and reports it")
      .value("skip", NonFinite::skip, "no change at all when any gradient is inf/nan");
  nb::enum_<StateFormat>(m, "StateFormat", "Storage of Adam's exp_avg and exp_avg_sq")
      .value("f32", StateFormat::f32, "fp32, exact")
      .value("bf16", StateFormat::bf16, "bf16, stochastically rounded")
      .value("q8", StateFormat::q8, "8-bit codes with one fp32 scale per block");
  nb::enum_<MasterFormat>(m, "MasterFormat", "Storage of the master parameter")
      .value("f32", MasterFormat::f32, "fp32")
      .value("bf16_kahan", MasterFormat::bf16_kahan, "bf16 plus a bf16 compensation buffer");
  m.def(
      "q8_scale_count", [](std::int64_t numel) { return optim::q8_scale_count(numel); }, "numel"_a,
      "fp32 block scales a q8 state of `numel` elements needs (blocks of 256).");

  nb::class_<AdamHyper>(m, "AdamHyper", "Adam/AdamW hyper-parameters (torch.optim meanings)")
      .def(
          "__init__",
          [](AdamHyper* self, float lr, float beta1, float beta2, float eps, float weight_decay,
             bool decoupled_weight_decay, bool amsgrad, bool bias_correction, bool maximize) {
            new (self) AdamHyper{lr, beta1, beta2, eps, weight_decay, decoupled_weight_decay,
                                 amsgrad, bias_correction, maximize};
          },
          "lr"_a = 1e-3f, "beta1"_a = 0.9f, "beta2"_a = 0.999f, "eps"_a = 1e-8f,
          "weight_decay"_a = 0.0f, "decoupled_weight_decay"_a = true, "amsgrad"_a = false,
          "bias_correction"_a = true, "maximize"_a = false)
      .def_rw("lr", &AdamHyper::lr)
      .def_rw("beta1", &AdamHyper::beta1)
      .def_rw("beta2", &AdamHyper::beta2)
      .def_rw("eps", &AdamHyper::eps)
      .def_rw("weight_decay", &AdamHyper::weight_decay)
      .def_rw("decoupled_weight_decay", &AdamHyper::decoupled_weight_decay)
      .def_rw("amsgrad", &AdamHyper::amsgrad)
      .def_rw("bias_correction", &AdamHyper::bias_correction)
      .def_rw("maximize", &AdamHyper::maximize);

  nb::class_<SgdHyper>(m, "SgdHyper", "SGD hyper-parameters (torch.optim.SGD meanings)")
      .def(
          "__init__",
          [](SgdHyper* self, float lr, float momentum, float dampening, float weight_decay,
             bool nesterov, bool maximize) {
            new (self) SgdHyper{lr, momentum, dampening, weight_decay, nesterov, maximize};
          },
          "lr"_a = 1e-3f, "momentum"_a = 0.0f, "dampening"_a = 0.0f, "weight_decay"_a = 0.0f,
          "nesterov"_a = false, "maximize"_a = false)
      .def_rw("lr", &SgdHyper::lr)
      .def_rw("momentum", &SgdHyper::momentum)
      .def_rw("dampening", &SgdHyper::dampening)
      .def_rw("weight_decay", &SgdHyper::weight_decay)
      .def_rw("nesterov", &SgdHyper::nesterov)
      .def_rw("maximize", &SgdHyper::maximize);

  nb::class_<LionHyper>(m, "LionHyper", "Lion hyper-parameters")
      .def(
          "__init__",
          [](LionHyper* self, float lr, float beta1, float beta2, float weight_decay,
             bool maximize) { new (self) LionHyper{lr, beta1, beta2, weight_decay, maximize}; },
          "lr"_a = 1e-4f, "beta1"_a = 0.9f, "beta2"_a = 0.99f, "weight_decay"_a = 0.0f,
          "maximize"_a = false)
      .def_rw("lr", &LionHyper::lr)
      .def_rw("beta1", &LionHyper::beta1)
      .def_rw("beta2", &LionHyper::beta2)
      .def_rw("weight_decay", &LionHyper::weight_decay)
      .def_rw("maximize", &LionHyper::maximize);

  nb::class_<StepArgs>(m, "StepArgs", "Per-call step settings")
      .def(
          "__init__",
          [](StepArgs* self, DType grad_dtype, DType copy_dtype, float grad_scale,
             std::int64_t step, NonFinite nonfinite, StateFormat state_format,
             MasterFormat master_format, std::uint64_t seed) {
            new (self) StepArgs{grad_dtype,   copy_dtype,    grad_scale, step, nonfinite,
                                state_format, master_format, seed};
          },
          "grad_dtype"_a = DType::f32, "copy_dtype"_a = DType::bf16, "grad_scale"_a = 1.0f,
          "step"_a = 1, "nonfinite"_a = NonFinite::ignore, "state_format"_a = StateFormat::f32,
          "master_format"_a = MasterFormat::f32, "seed"_a = 0)
      .def_rw("grad_dtype", &StepArgs::grad_dtype)
      .def_rw("copy_dtype", &StepArgs::copy_dtype)
      .def_rw("grad_scale", &StepArgs::grad_scale)
      .def_rw("step", &StepArgs::step)
      .def_rw("nonfinite", &StepArgs::nonfinite)
      .def_rw("state_format", &StepArgs::state_format)
      .def_rw("master_format", &StepArgs::master_format)
      .def_rw("seed", &StepArgs::seed);

  nb::class_<PyDeviceScalars>(m, "DeviceScalars",
                              "GPU-resident scalars (as data pointers, 0 = unused) for sync-free steps")
      .def(
          "__init__",
          [](PyDeviceScalars* self, std::uintptr_t inv_scale, std::uintptr_t found_inf,
             std::uintptr_t grad_sum_sq, float max_grad_norm) {
            new (self) PyDeviceScalars{inv_scale, found_inf, grad_sum_sq, max_grad_norm};
          },
          "inv_scale"_a = 0, "found_inf"_a = 0, "grad_sum_sq"_a = 0, "max_grad_norm"_a = 0.0f)
      .def_rw("inv_scale", &PyDeviceScalars::inv_scale)
      .def_rw("found_inf", &PyDeviceScalars::found_inf)
      .def_rw("grad_sum_sq", &PyDeviceScalars::grad_sum_sq)
      .def_rw("max_grad_norm", &PyDeviceScalars::max_grad_norm);
}

template <class Hyper, class CpuFn, class CudaFn>
void bind_pointer_api(nb::module_& m, const char* name, CpuFn cpu_fn, CudaFn cuda_fn) {
  std::string cpu_name = std::string("cpu_") + name + "_step";
  std::string cuda_name = std::string("cuda_") + name + "_step";
  m.def(
      cpu_name.c_str(),
      [cpu_fn](const PointerTable& slots, const Int64Vector& numels, const Hyper& h,
               const StepArgs& args) {
        auto v = slots_from_table(slots, numels);
        nb::gil_scoped_release release;
        return cpu_fn(v.data(), v.size(), h, args).found_nonfinite;
      },
      "slots"_a, "numels"_a, "hyper"_a, "args"_a,
      "Host step over a pointer table (see [Note: pointer tables]); returns found_nonfinite.");
  m.def(
      cuda_name.c_str(),
      [cuda_fn](const PointerTable& slots, const Int64Vector& numels, const Hyper& h,
                const StepArgs& args, const PyDeviceScalars& dev, std::uintptr_t stream) {
        auto v = slots_from_table(slots, numels);
        nb::gil_scoped_release release;
        cuda_fn(v.data(), v.size(), h, args, dev.to_core(), reinterpret_cast<void*>(stream));
      },
      "slots"_a, "numels"_a, "hyper"_a, "args"_a, "dev"_a, "stream"_a = 0,
      "GPU step over a pointer table, asynchronous on `stream` (a cudaStream_t as int).");
}

}  // namespace

void bind_optim(nb::module_& m) {
  bind_types(m);
  bind_pointer_api<AdamHyper>(m, "adam", &optim::cpu::adam_step, &optim::cuda::adam_step);
  bind_pointer_api<SgdHyper>(m, "sgd", &optim::cpu::sgd_step, &optim::cuda::sgd_step);
  bind_pointer_api<LionHyper>(m, "lion", &optim::cpu::lion_step, &optim::cuda::lion_step);

  m.def(
      "cpu_grad_stats",
      [](const Int64Vector& grads, const Int64Vector& numels, DType dtype, float scale) {
        MEGALITH_EXPECTS(grads.shape(0) == numels.shape(0), invalid_argument, "numels: expected ",
                         grads.shape(0), " entries, got ", numels.shape(0));
        auto ptrs = pointers_from_vector(grads);
        nb::gil_scoped_release release;
        auto s = optim::cpu::grad_stats(const_cast<const void* const*>(ptrs.data()), numels.data(),
                                        ptrs.size(), dtype, scale);
        return std::make_pair(s.sum_sq, s.found_nonfinite);
      },
      "grads"_a, "numels"_a, "grad_dtype"_a, "scale"_a = 1.0f,
      "(sum of squares of grad*scale, any inf/nan) over host buffers given as data pointers.");
  m.def(
      "cuda_grad_check",
      [](const Int64Vector& grads, const Int64Vector& numels, DType dtype, std::uintptr_t inv_scale,
         bool unscale_in_place, std::uintptr_t found_inf, std::uintptr_t sum_sq, std::uintptr_t stream) {
        MEGALITH_EXPECTS(grads.shape(0) == numels.shape(0), invalid_argument, "numels: expected ",
                         grads.shape(0), " entries, got ", numels.shape(0));
        auto ptrs = pointers_from_vector(grads);
        nb::gil_scoped_release release;
        optim::cuda::grad_check(ptrs.data(), numels.data(), ptrs.size(), dtype,
                                reinterpret_cast<const float*>(inv_scale), unscale_in_place,
                                reinterpret_cast<float*>(found_inf), reinterpret_cast<float*>(sum_sq),
                                reinterpret_cast<void*>(stream));
      },
      "grads"_a, "numels"_a, "grad_dtype"_a, "inv_scale"_a, "unscale_in_place"_a, "found_inf"_a,
      "sum_sq"_a, "stream"_a = 0,
      "Fused unscale + inf/nan flag + sum of squares over GPU buffers (data pointers); accumulates.");

  m.def(
      "adam_step_flat",
      [](const nb::ndarray<>& param, const nb::ndarray<>& grad, const nb::ndarray<>& exp_avg,
         const nb::ndarray<>& exp_avg_sq, const OptArray& max_exp_avg_sq, const OptArray& param_copy,
         const AdamHyper& hyper, std::int64_t step, float grad_scale, NonFinite nonfinite,
         std::uintptr_t stream, const OptArray& exp_avg_scale, const OptArray& exp_avg_sq_scale,
         const OptArray& param_comp, std::uint64_t seed) {
        MEGALITH_EXPECTS(!hyper.amsgrad || max_exp_avg_sq.has_value(), invalid_argument,
                         "max_exp_avg_sq: required when hyper.amsgrad is True");
        OptArray m1{exp_avg}, m2{exp_avg_sq};
        // fp32 param and exp_avg: the plain step, with its fp32-only dtype checks
        const bool lean = exp_avg.dtype() == nb::dtype<std::int8_t>() ||
                          exp_avg.dtype().code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat) ||
                          param.dtype().code == static_cast<std::uint8_t>(nb::dlpack::dtype_code::Bfloat);
        FlatParam fp = lean ? flat_param(param, grad,
                                         {{"exp_avg", &m1}, {"exp_avg_sq", &m2}, {"max_exp_avg_sq", &max_exp_avg_sq}},
                                         param_copy, step, grad_scale, nonfinite, {DType::f32, DType::bf16},
                                         {DType::f32, DType::bf16, DType::i8, DType::u8})
                            : flat_param(param, grad,
                                         {{"exp_avg", &m1}, {"exp_avg_sq", &m2}, {"max_exp_avg_sq", &max_exp_avg_sq}},
                                         param_copy, step, grad_scale, nonfinite);
        if (lean) {
          add_lean_formats(fp, param, exp_avg, exp_avg_sq, exp_avg_scale, exp_avg_sq_scale,
                           param_comp, seed);
        }
        MEGALITH_EXPECTS(!max_exp_avg_sq || dtype_of(*max_exp_avg_sq, "max_exp_avg_sq") == DType::f32,
                         type_error, "max_exp_avg_sq: expected float32 (amsgrad keeps fp32 states)");
        return run_flat(fp, hyper, stream, &optim::cpu::adam_step, &optim::cuda::adam_step);
      },
      "param"_a, "grad"_a, "exp_avg"_a, "exp_avg_sq"_a, "max_exp_avg_sq"_a = nb::none(),
      "param_copy"_a = nb::none(), nb::kw_only(), "hyper"_a, "step"_a, "grad_scale"_a = 1.0f,
      "nonfinite"_a = NonFinite::ignore, "stream"_a = 0, "exp_avg_scale"_a = nb::none(),
      "exp_avg_sq_scale"_a = nb::none(), "param_comp"_a = nb::none(), "seed"_a = 0,
      "One fused Adam/AdamW step on contiguous arrays (fp32 param/states; grad f32/bf16/f16;\n"
      "optional bf16/f16/f32 param_copy). Returns True when a non-finite gradient was seen.\n"
      "Lean states by dtype: bf16 exp_avg/exp_avg_sq, or int8/uint8 codes with float32\n"
      "exp_avg_scale/exp_avg_sq_scale; a bf16 param with param_comp is a Kahan master.");
  m.def(
      "sgd_step_flat",
      [](const nb::ndarray<>& param, const nb::ndarray<>& grad, const OptArray& momentum_buffer,
         const OptArray& param_copy, const SgdHyper& hyper, std::int64_t step, float grad_scale,
         NonFinite nonfinite, std::uintptr_t stream) {
        MEGALITH_EXPECTS(hyper.momentum == 0.0f || momentum_buffer.has_value(), invalid_argument,
                         "momentum_buffer: required when hyper.momentum != 0");
        FlatParam fp = flat_param(param, grad, {{"momentum_buffer", &momentum_buffer}}, param_copy,
                                  step, grad_scale, nonfinite);
        return run_flat(fp, hyper, stream, &optim::cpu::sgd_step, &optim::cuda::sgd_step);
      },
      "param"_a, "grad"_a, "momentum_buffer"_a = nb::none(), "param_copy"_a = nb::none(),
      nb::kw_only(), "hyper"_a, "step"_a, "grad_scale"_a = 1.0f, "nonfinite"_a = NonFinite::ignore,
      "stream"_a = 0, "One fused SGD step on contiguous arrays.");
  m.def(
      "lion_step_flat",
      [](const nb::ndarray<>& param, const nb::ndarray<>& grad, const nb::ndarray<>& exp_avg,
         const OptArray& param_copy, const LionHyper& hyper, std::int64_t step, float grad_scale,
         NonFinite nonfinite, std::uintptr_t stream) {
        OptArray m1{exp_avg};
        FlatParam fp = flat_param(param, grad, {{"exp_avg", &m1}}, param_copy, step, grad_scale,
                                  nonfinite);
        return run_flat(fp, hyper, stream, &optim::cpu::lion_step, &optim::cuda::lion_step);
      },
      "param"_a, "grad"_a, "exp_avg"_a, "param_copy"_a = nb::none(), nb::kw_only(), "hyper"_a,
      "step"_a, "grad_scale"_a = 1.0f, "nonfinite"_a = NonFinite::ignore, "stream"_a = 0,
      "One fused Lion step on contiguous arrays.");
}

}  // namespace megalith::bindings
