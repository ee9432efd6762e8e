#pragma once
// Umbrella header for embedders: find_package(megalith) + megalith::core.

#include "megalith/build_info.h"
#include "megalith/config.h"
#include "megalith/cpu/simd_level.h"
#include "megalith/cpu/thread_pool.h"
#include "megalith/cuda/device.h"
#include "megalith/cuda/optim.h"
#include "megalith/dtype.h"
#include "megalith/error.h"
#include "megalith/optim/cpu.h"
#include "megalith/optim/hyper.h"
#include "megalith/optim/slots.h"
