// compressed-tensors `mxfp4-pack-quantized` weights (Kimi K3's routed experts): a matrix [R, C] stored as
// weight_packed [R, C/2] (two e2m1 codes per byte, low nibble = even column, bit 3 = sign, magnitudes
// {0, 0.5, 1, 1.5, 2, 3, 4, 6}) and weight_scale [R, C/32] (UE8M0: a group of 32 columns is scaled by
// 2^(s - 127)). The CPU backend dequantizes at load; GPU backends can take the packed bytes as they are.
#pragma once

#include <string>

#include "base/tensor.h"

namespace hlm {

// packed [R, C/2] U8 + scale [R, C/32] U8 -> F32 [R, C]. Shapes that do not fit together are an error
// naming `name` (the weight's checkpoint name).
Tensor dequantize_mxfp4(const Tensor& packed, const Tensor& scale, const std::string& name);

}  // namespace hlm
