// WeightReader: this rank's share of each weight, read from the checkpoint as an F32 host tensor. The
// box comes from the shard plan (weight_layout.h), so a rank never touches bytes it does not hold.
#pragma once

#include <map>
#include <string>

#include "model/weight_layout.h"
#include "weights/safetensors.h"

namespace hlm {

class WeightReader {
 public:
  // Checks that every tensor of the layout is present with its expected shape (header only) before any
  // byte is read, so a wrong checkpoint fails fast with the tensor, file and expected shape.
  WeightReader(const Checkpoint& ckpt, const ModelConfig& cfg, const Mapping& mapping);

  // This rank's box of the weight `key`, as F32.
  Tensor read(const std::string& key);
  // The same in the stored dtype (e.g. U8 for packed MXFP4).
  Tensor read_raw(const std::string& key);
  // Whether the layout has a weight `key` (K3-only weights are absent from Kimi Linear layouts).
  bool has(const std::string& key) const { return specs_.count(key) != 0; }
  // Whether this rank holds any of `key` (routed experts live on one EP rank).
  bool holds(const std::string& key) const;
  const WeightSpec& spec(const std::string& key) const;
  size_t bytes_read() const { return ckpt_.bytes_read(); }

 private:
  // The stored name of the spec's tensor in this checkpoint (the name or one of its aliases).
  const std::string& stored_name(const WeightSpec& spec) const;

  const Checkpoint& ckpt_;
  Mapping mapping_;
  std::map<std::string, WeightSpec> specs_;
};

}  // namespace hlm
