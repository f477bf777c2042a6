#include "model/host_transforms.h"

#include <cstring>

#include "base/error.h"

namespace hlm {

Tensor concat_rows(const std::vector<Tensor>& parts) {
  HLM_CHECK(!parts.empty(), "concat_rows of nothing");
  Shape shape = parts[0].shape();
  int64_t rows = 0;
  for (const Tensor& p : parts) {
    Shape tail(p.shape().begin() + 1, p.shape().end());
    HLM_CHECK(p.dtype() == DType::kF32 && tail == Shape(shape.begin() + 1, shape.end()),
              "concat_rows: {} does not match {}", p.describe(), parts[0].describe());
    rows += p.dim(0);
  }
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, DType::kF32);
  auto* dst = static_cast<std::byte*>(out.raw());
  for (const Tensor& p : parts) {
    std::memcpy(dst, p.raw(), p.nbytes());
    dst += p.nbytes();
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& parts) {
  HLM_CHECK(!parts.empty(), "stack of nothing");
  Shape shape = parts[0].shape();
  for (const Tensor& p : parts) {
    HLM_CHECK(p.shape() == shape, "stack: {} does not match {}", p.describe(), parts[0].describe());
  }
  std::vector<Tensor> rows;
  for (const Tensor& p : parts) {
    Shape s = shape;
    s.insert(s.begin(), 1);
    rows.push_back(p.reshape(s));
  }
  return concat_rows(rows);
}

Tensor transpose_last2(const Tensor& t) {
  HLM_CHECK(t.rank() == 3 && t.dtype() == DType::kF32, "transpose_last2 expects F32 [H, a, b], got {}",
            t.describe());
  const int64_t h = t.dim(0), a = t.dim(1), b = t.dim(2);
  Tensor out = Tensor::empty({h, b, a}, DType::kF32);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t x = 0; x < h; ++x) {
    for (int64_t i = 0; i < a; ++i) {
      for (int64_t j = 0; j < b; ++j) dst[(x * b + j) * a + i] = src[(x * a + i) * b + j];
    }
  }
  return out;
}

}  // namespace hlm
