// Where a rank's weights come from. Layers ask a WeightSource for a weight by its logical key (the shard
// plan's, weight_layout.h) and get a backend tensor holding this rank's box of it, in the dtype the
// backend keeps that weight in. Two sources:
//   WeightReader  — a checkpoint: only the bytes of the rank's box are read (Checkpoint box reads), then
//                   uploaded (a device backend streams them through pinned staging buffers);
//   RandomWeights — no checkpoint: reproducible random values generated on the backend itself, so a
//                   full-size model (98 GB for Kimi-Linear-48B) can be benchmarked without its files.
#pragma once

#include <map>
#include <string>

#include "model/weight_layout.h"
#include "ops/ops.h"
#include "weights/safetensors.h"

namespace hlm {

class WeightSource {
 public:
  // `ops` may be null for a source that is only read on the host (tests, tools).
  WeightSource(const ModelConfig& cfg, const Mapping& mapping, Ops* ops);
  virtual ~WeightSource() = default;

  // Whether the layout has a weight `key` (K3-only weights are absent from Kimi Linear layouts).
  bool has(const std::string& key) const { return specs_.count(key) != 0; }
  const WeightSpec& spec(const std::string& key) const;
  // Whether this rank holds any of `key` (routed experts live on one EP rank).
  bool holds(const std::string& key) const;
  // This rank's box of `key` and its shape.
  TensorBox box(const std::string& key) const;
  Shape shard_shape(const std::string& key) const;
  virtual DType stored_dtype(const std::string& key) const = 0;

  // This rank's shard of `key` as a new backend tensor (dtype: ops.weight_dtype of the stored dtype).
  Tensor load(const std::string& key);
  // The same into an existing backend tensor of the shard's element count, e.g. a slice of a fused
  // projection or one expert of a stacked tensor; converts to dst's dtype.
  void load_into(const std::string& key, Tensor dst);
  // This rank's shard as an F32 host tensor, for the few weights checked on the host.
  virtual Tensor read_host_f32(const std::string& key) = 0;
  // Bytes read from the checkpoint so far (0 for random weights).
  virtual size_t bytes_read() const = 0;
  // Bytes placed on the backend so far, and what all of this rank's weights will take there.
  int64_t bytes_loaded() const { return bytes_loaded_; }
  int64_t bytes_to_load() const;

 protected:
  // Fills dst (a backend tensor with the box's elements) with the box of `spec`.
  virtual void fill(const WeightSpec& spec, const TensorBox& box, Tensor& dst) = 0;
  Ops& ops() const;

  Mapping mapping_;
  std::map<std::string, WeightSpec> specs_;

 private:
  Ops* ops_;
  int64_t bytes_loaded_ = 0;
};

class WeightReader final : public WeightSource {
 public:
  // Checks that every tensor of the layout is present with its expected shape and a dtype the loader
  // reads for it (checked_tensor: header only) before any byte is read, so a wrong checkpoint fails fast
  // with the tensor, file and what would be valid.
  WeightReader(const Checkpoint& ckpt, const ModelConfig& cfg, const Mapping& mapping, Ops* ops = nullptr);

  DType stored_dtype(const std::string& key) const override;
  Tensor read_host_f32(const std::string& key) override { return read(key); }
  size_t bytes_read() const override { return ckpt_.bytes_read(); }

  // This rank's box of the weight `key` on the host, as F32 or in the stored dtype (U8 for MXFP4).
  Tensor read(const std::string& key);
  Tensor read_raw(const std::string& key);

 protected:
  void fill(const WeightSpec& spec, const TensorBox& box, Tensor& dst) override;

 private:
  const Checkpoint& ckpt_;
};

class RandomWeights final : public WeightSource {
 public:
  RandomWeights(const ModelConfig& cfg, const Mapping& mapping, Ops& ops, uint64_t seed);

  DType stored_dtype(const std::string& key) const override { return spec(key).typical_dtype; }
  Tensor read_host_f32(const std::string& key) override;  // zeros of the shard's shape
  size_t bytes_read() const override { return 0; }

 protected:
  void fill(const WeightSpec& spec, const TensorBox& box, Tensor& dst) override;

 private:
  uint64_t seed_;
};

}  // namespace hlm
