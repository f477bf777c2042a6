#include "base/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace hlm {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    // A negative dimension is reported by whoever checks shapes (reshape, empty); a product that wraps
    // would size a buffer smaller than its shape, so it is an error here.
    HLM_CHECK(!__builtin_mul_overflow(n, d, &n), "shape {} has more elements than 64-bit sizes hold",
              shape_str(shape));
  }
  return n;
}

size_t Tensor::nbytes() const {
  const int64_t n = numel();
  int64_t bytes = 0;
  HLM_CHECK(n >= 0 && !__builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype_)), &bytes),
            "tensor {}: byte size overflows 64-bit sizes", describe());
  return static_cast<size_t>(bytes);
}

namespace {

std::shared_ptr<void> host_alloc(size_t bytes) {
  constexpr size_t kAlign = 64;
  size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded == 0 ? kAlign : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<void>(p, std::free);
}

}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype) {
  for (int64_t d : shape) HLM_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.storage_ = host_alloc(t.nbytes());
  return t;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  std::memset(t.raw(), 0, t.nbytes());
  return t;
}

Tensor Tensor::filled(Shape shape, float value) {
  Tensor t = empty(std::move(shape), DType::kF32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value;
  return t;
}

Tensor Tensor::from_vector(Shape shape, const std::vector<float>& values) {
  Tensor t = empty(std::move(shape), DType::kF32);
  HLM_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_vector: {} values for shape {}",
            values.size(), shape_str(t.shape()));
  std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::from_vector_i32(Shape shape, const std::vector<int32_t>& values) {
  Tensor t = empty(std::move(shape), DType::kI32);
  HLM_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_vector_i32: {} values for shape {}",
            values.size(), shape_str(t.shape()));
  std::memcpy(t.raw(), values.data(), t.nbytes());
  return t;
}

Tensor Tensor::wrap(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner) {
  Tensor t;
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  t.device_ = device;
  // Aliasing constructor: shares ownership with `owner`, points at `data`.
  t.storage_ = std::shared_ptr<void>(std::move(owner), data);
  return t;
}

int64_t Tensor::dim(int i) const {
  int r = rank();
  int j = i < 0 ? i + r : i;
  HLM_CHECK(j >= 0 && j < r, "dimension {} out of range for tensor {}", i, describe());
  return shape_[j];
}

Tensor Tensor::reshape(Shape shape) const {
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      HLM_CHECK(infer < 0, "reshape {}: more than one -1 in {}", describe(), shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    HLM_CHECK(known > 0 && numel() % known == 0, "reshape {} to {}: sizes do not divide", describe(),
              shape_str(shape));
    shape[infer] = numel() / known;
  }
  HLM_CHECK(shape_numel(shape) == numel(), "reshape {} to {}: element counts differ", describe(),
            shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(shape);
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  HLM_CHECK(rank() >= 1, "slice of a scalar tensor");
  HLM_CHECK(0 <= begin && begin <= end && end <= shape_[0], "slice [{}, {}) out of range for {}", begin, end,
            describe());
  Tensor t = *this;
  int64_t row = numel() / (shape_[0] == 0 ? 1 : shape_[0]);
  t.offset_ = offset_ + static_cast<size_t>(begin * row) * dtype_size(dtype_);
  t.shape_[0] = end - begin;
  return t;
}

Tensor Tensor::operator[](int64_t i) const {
  Tensor t = slice(i, i + 1);
  t.shape_.erase(t.shape_.begin());
  return t;
}

Tensor Tensor::clone() const {
  HLM_CHECK(device_ == Device::kCpu, "clone of a device tensor {}", describe());
  Tensor t = empty(shape_, dtype_);
  if (nbytes() > 0) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

std::string Tensor::describe() const { return fmt::format("{}{}", dtype_name(dtype_), shape_str(shape_)); }

void Tensor::check_access(DType requested) const {
  bool ok = requested == dtype_ || (requested == DType::kBF16 && dtype_ == DType::kF16);
  HLM_CHECK(ok, "typed access as {} to a {} tensor", dtype_name(requested), describe());
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  HLM_CHECK(t.shape() == expected, "{}: expected shape {}, got {}", what, shape_str(expected),
            shape_str(t.shape()));
}

}  // namespace hlm
