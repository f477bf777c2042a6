// NumPy .npy files (format version 1.0, little-endian, C order): the logits output of `helixlm logits` and
// the golden references written by tools/make_golden.py.
#pragma once

#include <string>

#include "base/tensor.h"

namespace hlm {

// Writes an F32 or I32 host tensor.
void write_npy(const std::string& path, const Tensor& t);

// Reads '<f4' or '<i4' arrays; anything else is an error naming the file.
Tensor read_npy(const std::string& path);

}  // namespace hlm
