#include "base/tensor.h"

#include <gtest/gtest.h>

#include "base/checked_math.h"

namespace hlm {
namespace {

TEST(Tensor, ReshapeInfersOneDimension) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::kF32);
  EXPECT_EQ(t.reshape({-1, 4}).shape(), (Shape{6, 4}));
  EXPECT_THROW(t.reshape({5, -1}), Error);
  EXPECT_THROW(t.reshape({-1, -1}), Error);
}

TEST(Tensor, SliceSharesStorage) {
  Tensor t = Tensor::from_vector({3, 2}, {0, 1, 2, 3, 4, 5});
  Tensor s = t.slice(1, 3);
  EXPECT_EQ(s.shape(), (Shape{2, 2}));
  EXPECT_EQ(s.data<float>()[0], 2.0f);
  s.data<float>()[0] = 9.0f;
  EXPECT_EQ(t.data<float>()[2], 9.0f);
  EXPECT_EQ(t[2].shape(), (Shape{2}));
  EXPECT_EQ(t[2].data<float>()[1], 5.0f);
  EXPECT_THROW(t.slice(2, 4), Error);
}

TEST(Tensor, TypedAccessChecksDtype) {
  Tensor t = Tensor::zeros({2}, DType::kI32);
  EXPECT_NO_THROW(t.data<int32_t>());
  EXPECT_THROW(t.data<float>(), Error);
}

TEST(Tensor, CheckShapeNamesTheTensor) {
  Tensor t = Tensor::zeros({2, 3}, DType::kF32);
  try {
    check_shape(t, {3, 2}, "q_proj");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q_proj"), std::string::npos);
  }
}

// Regression (issue 12): shape products and byte sizes wrapped silently, so a huge shape allocated a tiny
// buffer that later writes overran.
TEST(Tensor, SizeOverflowIsAnErrorNamingTheShape) {
  const int64_t big = int64_t{1} << 40;
  EXPECT_THROW(shape_numel({big, big}), Error);
  try {
    Tensor::empty({big, big, 4}, DType::kF32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[1099511627776, 1099511627776, 4]"), std::string::npos) << e.what();
  }
  // The element count fits in int64, the byte count does not.
  try {
    Tensor::empty({int64_t{1} << 62}, DType::kF32);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("F32[4611686018427387904]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(shape_numel({big, 1024}), big * 1024);
}

TEST(CheckedMath, NamesWhatOverflowed) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  try {
    checked_mul(int64_t{1} << 32, int64_t{1} << 32, "MLA pages");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MLA pages: 4294967296 x 4294967296 overflows"), std::string::npos);
  }
  EXPECT_THROW(checked_add(INT64_MAX, 1, "x"), Error);
  EXPECT_THROW(checked_mul(-1, 2, "x"), Error);
}

}  // namespace
}  // namespace hlm
