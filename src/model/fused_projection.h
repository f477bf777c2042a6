// Several projections of one layer input stacked in one weight tensor, so that a decode step runs a single
// GEMM where it ran one per projection (the small ones alone were launch-bound: 2-8 CTAs and about 3.5 µs
// each for 0.6 MB on an H200); each part is then its columns of the output: a view for one row, a copy for
// more. Past kFusedMaxRows rows each part runs its own GEMM on its rows of the stacked weight instead, as the
// copies then cost more than the launches saved. Measured on an H200 with Kimi-Linear-48B: an 8K-token
// prefill ran at 9,071 tokens/s with the stacked GEMM and column copies at every row count, against 9,590
// for the unstacked build in the same call (9,691 with this rule, against 9,692, in a later call). A part
// whose stored dtype differs from the first part's keeps a tensor of its own (stacking it would change its
// numerics), unless it is marked `required`, as the q, k and v rows that a KDA layer convolves as one block
// are.
#pragma once

#include <string>
#include <vector>

#include "model/weight_source.h"
#include "ops/ops.h"

namespace hlm {

class FusedProjection {
 public:
  struct Part {
    std::string key;        // a weight whose shard is [rows, hidden] (any shape of that many elements)
    bool required = false;  // always stacked, converted to the stacked dtype
  };

  FusedProjection() = default;
  FusedProjection(Ops& ops, WeightSource& w, const std::vector<Part>& parts, int64_t hidden);

  static constexpr int64_t kFusedMaxRows = 16;  // a decode batch

  // x [T, hidden] -> the stacked GEMM's output [T, stacked rows] up to kFusedMaxRows rows, else undefined
  // (no GEMM).
  Tensor forward(Ops& ops, const Tensor& x) const;
  // Part i of the projection of x [T, rows_i]: its columns of `out` (forward's result for x) when defined,
  // else its own GEMM.
  Tensor part(Ops& ops, const Tensor& x, const Tensor& out, size_t i) const;
  // Parts [first, last] together [T, Σ rows], which must be stacked and consecutive.
  Tensor parts(Ops& ops, const Tensor& x, const Tensor& out, size_t first, size_t last) const;
  int64_t rows(size_t i) const { return ranges_.at(i).end - ranges_.at(i).begin; }
  // Part i's first column in forward's output, or -1 where the part has a GEMM of its own.
  int64_t column(size_t i) const { return ranges_.at(i).own.defined() ? -1 : ranges_.at(i).begin; }

 private:
  struct Range {
    Tensor own;  // [rows, hidden], defined only when not stacked
    int64_t begin = 0, end = 0;
  };
  Tensor stacked_;  // [Σ stacked rows, hidden]
  std::vector<Range> ranges_;
};

}  // namespace hlm
