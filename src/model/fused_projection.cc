#include "model/fused_projection.h"

namespace hlm {

FusedProjection::FusedProjection(Ops& ops, WeightSource& w, const std::vector<Part>& parts, int64_t hidden) {
  HLM_CHECK(!parts.empty(), "FusedProjection: no parts");
  const DType dtype = ops.weight_dtype(w.stored_dtype(parts.front().key));
  int64_t rows = 0;
  for (const Part& p : parts) {
    const int64_t numel = shape_numel(w.shard_shape(p.key));
    HLM_CHECK(numel % hidden == 0, "weight '{}': this rank's shard of {} elements is not [rows, {}]",
              w.spec(p.key).name, numel, hidden);
    Range r;
    if (p.required || ops.weight_dtype(w.stored_dtype(p.key)) == dtype) {
      r.begin = rows;
      r.end = rows += numel / hidden;
    } else {
      r.own = w.load(p.key).reshape({numel / hidden, hidden});
      r.end = numel / hidden;
    }
    ranges_.push_back(r);
  }
  stacked_ = ops.empty({rows, hidden}, dtype);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (!ranges_[i].own.defined())
      w.load_into(parts[i].key, stacked_.slice(ranges_[i].begin, ranges_[i].end));
  }
}

Tensor FusedProjection::forward(Ops& ops, const Tensor& x) const {
  return x.dim(0) <= kFusedMaxRows ? ops.linear(x, stacked_) : Tensor();
}

Tensor FusedProjection::part(Ops& ops, const Tensor& x, const Tensor& out, size_t i) const {
  const Range& r = ranges_.at(i);
  if (r.own.defined()) return ops.linear(x, r.own);
  return out.defined() ? ops.slice_last(out, r.begin, r.end) : ops.linear(x, stacked_.slice(r.begin, r.end));
}

Tensor FusedProjection::parts(Ops& ops, const Tensor& x, const Tensor& out, size_t first, size_t last) const {
  for (size_t i = first; i <= last; ++i) {
    HLM_CHECK(!ranges_.at(i).own.defined() && (i == first || ranges_[i].begin == ranges_[i - 1].end),
              "FusedProjection: parts {}..{} are not stacked consecutively", first, last);
  }
  const int64_t begin = ranges_[first].begin, end = ranges_[last].end;
  return out.defined() ? ops.slice_last(out, begin, end) : ops.linear(x, stacked_.slice(begin, end));
}

}  // namespace hlm
