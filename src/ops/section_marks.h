// Section timing (`bench --layer-split`): the model marks where each part of a step begins (the embedding,
// each layer's attention and FFN, the head), and a backend times the work between consecutive marks.
// SectionMarks is the bookkeeping the backends share: the slot of each mark within a step and the labels
// of the last complete step. A backend keeps one clock reading per slot (a host time on the CPU, a CUDA
// event on a GPU); slots are reused step after step, so a CUDA graph captured once records into the same
// events on every replay, and the labels stay those of the step that built it.
#pragma once

#include <string>
#include <vector>

#include "base/error.h"

namespace hlm {

struct SectionTime {
  std::string label;
  double seconds = 0;
};

class SectionMarks {
 public:
  // The slot of a mark: the step's marks count from 0, and a null label (the step's end) completes it.
  size_t mark(const char* label) {
    const size_t slot = next_++;
    if (labels_.size() <= slot) labels_.resize(slot + 1);
    labels_[slot] = label == nullptr ? "" : label;
    if (label == nullptr) {
      complete_ = next_;
      next_ = 0;
    }
    return slot;
  }
  // Marks of the last complete step (0 before any): sections are the spans between slots i and i + 1.
  size_t complete() const { return complete_; }
  const std::string& label(size_t slot) const {
    HLM_CHECK(slot < labels_.size(), "section mark {} was never made", slot);
    return labels_[slot];
  }
  // Sections of the last complete step, from `seconds_between(i, i + 1)` of each labelled slot i.
  template <class Clock>
  std::vector<SectionTime> sections(const Clock& seconds_between) const {
    std::vector<SectionTime> out;
    for (size_t i = 0; i + 1 < complete_; ++i) {
      if (!labels_[i].empty()) out.push_back(SectionTime{labels_[i], seconds_between(i, i + 1)});
    }
    return out;
  }

 private:
  std::vector<std::string> labels_;
  size_t next_ = 0;
  size_t complete_ = 0;
};

}  // namespace hlm
