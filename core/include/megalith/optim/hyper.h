#pragma once
// Hyper-parameters of the optimizers, with torch.optim's meanings.

#include <cstdint>

namespace megalith::optim {

/// Adam / AdamW. decoupled_weight_decay=true is AdamW (p *= 1 - lr*wd);
/// false adds wd*p to the gradient (Adam's L2 form).
struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool decoupled_weight_decay = true;
  bool amsgrad = false;
  bool bias_correction = true;
  bool maximize = false;
};

/// SGD with torch.optim.SGD's momentum, dampening and nesterov semantics.
struct SgdHyper {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
  bool maximize = false;
};

/// Lion (Chen et al. 2023): sign of an interpolated momentum, decoupled decay.
struct LionHyper {
  float lr = 1e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float weight_decay = 0.0f;
  bool maximize = false;
};

}  // namespace megalith::optim
