#include "weights/mxfp4.h"

#include <cmath>

namespace hlm {

namespace {

constexpr float kE2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
constexpr int64_t kGroup = 32;

float decode(uint8_t code) {
  const float magnitude = kE2m1[code & 7];
  return (code & 8) != 0 ? -magnitude : magnitude;
}

}  // namespace

Tensor dequantize_mxfp4(const Tensor& packed, const Tensor& scale, const std::string& name) {
  HLM_CHECK(packed.dtype() == DType::kU8 && packed.rank() == 2,
            "MXFP4 weight '{}': weight_packed must be U8 [R, C/2], got {}", name, packed.describe());
  HLM_CHECK(scale.dtype() == DType::kU8 && scale.rank() == 2,
            "MXFP4 weight '{}': weight_scale must be U8 [R, C/32], got {}", name, scale.describe());
  const int64_t rows = packed.dim(0), cols = packed.dim(1) * 2;
  HLM_CHECK(scale.dim(0) == rows && scale.dim(1) * kGroup == cols,
            "MXFP4 weight '{}': weight_packed {} holds {} columns, which needs weight_scale [{}, {}], got {}",
            name, packed.describe(), cols, rows, cols / kGroup, scale.describe());
  Tensor out = Tensor::empty({rows, cols}, DType::kF32);  // [R, C]
  const uint8_t* p = packed.data<uint8_t>();
  const uint8_t* s = scale.data<uint8_t>();
  float* y = out.data<float>();
  // A scale of 0xFF (NaN in UE8M0) or one that overflows fp32 gives non-finite weights; they are caught
  // here, as the values are written, instead of in a second pass.
  bool bad = false;
#pragma omp parallel for reduction(|| : bad)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; c += 2) {
      const uint8_t code = s[r * (cols / kGroup) + c / kGroup];
      const float factor = std::ldexp(1.0f, static_cast<int>(code) - 127);
      const uint8_t byte = p[r * (cols / 2) + c / 2];
      const float lo = decode(byte & 0xf) * factor, hi = decode(byte >> 4) * factor;
      bad = bad || code == 0xff || !std::isfinite(lo) || !std::isfinite(hi);
      y[r * cols + c] = lo;
      y[r * cols + c + 1] = hi;
    }
  }
  HLM_CHECK(
      !bad,
      "MXFP4 weight '{}': weight_scale holds 0xFF (NaN in UE8M0) or a scale whose values overflow fp32; "
      "the checkpoint is corrupt",
      name);
  return out;
}

}  // namespace hlm
