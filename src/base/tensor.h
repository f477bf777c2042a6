// Tensor: a contiguous, row-major block of elements with a shape, a dtype and a device. Storage is
// reference-counted, so views (reshape, slices of the leading dimension) share it. There are no strides:
// every tensor is contiguous, which keeps ops simple and makes shape assumptions checkable in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"

namespace hlm {

enum class Device : uint8_t { kCpu, kCuda };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
// Product of the dimensions; throws naming the shape if it overflows int64.
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Host allocations, 64-byte aligned. empty() leaves the contents uninitialized.
  static Tensor empty(Shape shape, DType dtype);
  static Tensor zeros(Shape shape, DType dtype);
  static Tensor filled(Shape shape, float value);  // F32
  static Tensor from_vector(Shape shape, const std::vector<float>& values);
  static Tensor from_vector_i32(Shape shape, const std::vector<int32_t>& values);
  // Wraps memory owned elsewhere; `owner` keeps it alive (an mmap, a device allocation).
  static Tensor wrap(void* data, Shape shape, DType dtype, Device device, std::shared_ptr<void> owner);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the end.
  int64_t dim(int i) const;
  int64_t numel() const { return shape_numel(shape_); }
  // numel() x element size; throws naming the tensor if that overflows int64.
  size_t nbytes() const;
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }

  void* raw() { return static_cast<std::byte*>(storage_.get()) + offset_; }
  const void* raw() const { return static_cast<const std::byte*>(storage_.get()) + offset_; }

  // Typed access; throws if T does not match the dtype (16-bit floats are read as uint16_t).
  template <class T>
  T* data() {
    check_access(DTypeOf<T>::value);
    return static_cast<T*>(raw());
  }
  template <class T>
  const T* data() const {
    check_access(DTypeOf<T>::value);
    return static_cast<const T*>(raw());
  }

  // Same storage, new shape with the same element count. One dimension may be -1.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the leading dimension, sharing storage.
  Tensor slice(int64_t begin, int64_t end) const;
  // Element i of the leading dimension, with that dimension dropped.
  Tensor operator[](int64_t i) const;
  // A deep copy on the host.
  Tensor clone() const;

  std::string describe() const;  // "F32[3, 4]"

 private:
  void check_access(DType requested) const;

  std::shared_ptr<void> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

// Throws naming `what` unless t has exactly this shape.
void check_shape(const Tensor& t, const Shape& expected, const char* what);

}  // namespace hlm
