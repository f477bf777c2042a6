// LayerEnv: what every layer needs to run, passed explicitly instead of held in globals.
#pragma once

#include "config/model_config.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/mapping.h"

namespace hlm {

struct LayerEnv {
  const ModelConfig& cfg;
  const Mapping& mapping;
  Ops& ops;
  Comm& comm;
};

}  // namespace hlm
