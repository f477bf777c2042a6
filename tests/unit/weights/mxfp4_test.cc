// MXFP4 dequantization against values worked out by hand from the format (docs/k3.md), and the load
// errors for packed/scale tensors that do not fit together.
#include "weights/mxfp4.h"

#include <gtest/gtest.h>

#include "base/error.h"

namespace hlm {
namespace {

Tensor bytes(Shape shape, const std::vector<uint8_t>& v) {
  Tensor t = Tensor::empty(std::move(shape), DType::kU8);
  std::copy(v.begin(), v.end(), t.data<uint8_t>());
  return t;
}

TEST(Mxfp4, DecodesNibblesSignsAndScales) {
  // One row of 64 columns: two groups of 32. Byte 0x9A: low nibble 0xA (sign, code 2 = 1.0), high nibble
  // 0x9 (sign, code 1 = 0.5). Byte 0x7F: low 0xF = -6, high 0x7 = 6. Scale 128 doubles, 126 halves.
  std::vector<uint8_t> packed(32, 0x00);
  packed[0] = 0x9A;
  packed[1] = 0x7F;
  packed[16] = 0x35;  // group 2, columns 32 and 33: low 0x5 = 3.0, high 0x3 = 1.5
  const Tensor w = dequantize_mxfp4(bytes({1, 32}, packed), bytes({1, 2}, {128, 126}), "w1");
  ASSERT_EQ(w.shape(), (Shape{1, 64}));
  const float* p = w.data<float>();
  EXPECT_EQ(p[0], -2.0f);   // -1.0 · 2^1
  EXPECT_EQ(p[1], -1.0f);   // -0.5 · 2^1
  EXPECT_EQ(p[2], -12.0f);  // -6 · 2
  EXPECT_EQ(p[3], 12.0f);
  EXPECT_EQ(p[4], 0.0f);
  EXPECT_EQ(p[32], 1.5f);   // 3.0 · 2^-1
  EXPECT_EQ(p[33], 0.75f);  // 1.5 · 2^-1
  EXPECT_EQ(p[63], 0.0f);
}

TEST(Mxfp4, EveryCodeAtUnitScale) {
  const float magnitudes[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  std::vector<uint8_t> packed(16);
  for (int i = 0; i < 16; ++i) packed[i] = static_cast<uint8_t>(i | (15 - i) << 4);
  const Tensor w = dequantize_mxfp4(bytes({1, 16}, packed), bytes({1, 1}, {127}), "w");
  for (int i = 0; i < 16; ++i) {
    const float low = (i & 8 ? -1.0f : 1.0f) * magnitudes[i & 7];
    const float high = ((15 - i) & 8 ? -1.0f : 1.0f) * magnitudes[(15 - i) & 7];
    EXPECT_EQ(w.data<float>()[2 * i], low) << i;
    EXPECT_EQ(w.data<float>()[2 * i + 1], high) << i;
  }
}

// Regression (issue 12): non-finite weights are refused at load. A UE8M0 scale of 0xFF is NaN; 254 makes
// every code above 1.5 overflow fp32.
TEST(Mxfp4, NonFiniteScalesAreLoadErrorsNamingTheWeight) {
  const Tensor packed = bytes({1, 16}, std::vector<uint8_t>(16, 0x77));  // code 7 = 6.0 everywhere
  for (uint8_t scale : {uint8_t{0xff}, uint8_t{254}}) {
    try {
      dequantize_mxfp4(packed, bytes({1, 1}, {scale}), "experts.3.w1");
      FAIL() << int{scale};
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("MXFP4 weight 'experts.3.w1': weight_scale holds 0xFF"),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(dequantize_mxfp4(packed, bytes({1, 1}, {252}), "w").data<float>()[0], 6.0f * 0x1p125f);
}

TEST(Mxfp4, MismatchedTensorsAreLoadErrorsNamingTheWeight) {
  try {
    dequantize_mxfp4(bytes({2, 16}, std::vector<uint8_t>(32)), bytes({2, 2}, std::vector<uint8_t>(4)),
                     "experts.3.w2");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("experts.3.w2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs weight_scale [2, 1]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(dequantize_mxfp4(Tensor::zeros({2, 16}, DType::kF32), bytes({2, 1}, {1, 1}), "w"), Error);
  EXPECT_THROW(dequantize_mxfp4(bytes({2, 16}, std::vector<uint8_t>(32)), bytes({3, 1}, {1, 1, 1}), "w"),
               Error);
}

}  // namespace
}  // namespace hlm
