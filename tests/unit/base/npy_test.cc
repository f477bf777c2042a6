#include "base/npy.h"

#include <fstream>

#include <gtest/gtest.h>

namespace hlm {
namespace {

TEST(Npy, RoundTripsF32AndI32) {
  std::string path = std::string(HLM_SCRATCH_DIR) + "/rt.npy";
  Tensor t = Tensor::from_vector({2, 3}, {1, 2, 3, 4, 5, 6});
  write_npy(path, t);
  Tensor r = read_npy(path);
  ASSERT_EQ(r.shape(), t.shape());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(r.data<float>()[i], t.data<float>()[i]);

  Tensor v = Tensor::from_vector_i32({4}, {7, -1, 0, 3});
  write_npy(path, v);
  Tensor w = read_npy(path);
  ASSERT_EQ(w.shape(), (Shape{4}));
  EXPECT_EQ(w.data<int32_t>()[1], -1);
}

TEST(Npy, RejectsGarbage) {
  std::string path = std::string(HLM_SCRATCH_DIR) + "/bad.npy";
  std::ofstream(path) << "not numpy";
  EXPECT_THROW(read_npy(path), Error);
  EXPECT_THROW(read_npy(path + ".missing"), Error);
}

}  // namespace
}  // namespace hlm
