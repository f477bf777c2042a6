#include "base/tensor.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace hlm
