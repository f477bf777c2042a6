// IdPool: the free list of a pool of ids [0, capacity) (MLA pages, KDA state slots). Ids never handed out
// are one counter, not a list, so the pool's own memory is proportional to the ids released, not to its
// capacity: a page pool sized for 2^31 pages costs nothing until pages are used. Fresh ids go out lowest
// first; released ids are reused before fresh ones, the last released first.
#pragma once

#include <cstdint>
#include <vector>

#include "base/error.h"

namespace hlm {

class IdPool {
 public:
  explicit IdPool(int64_t capacity) : capacity_(capacity) {
    HLM_CHECK(capacity >= 0 && capacity - 1 <= INT32_MAX, "id pool of {} ids: ids are int32", capacity);
  }

  int64_t capacity() const { return capacity_; }
  int64_t free() const { return capacity_ - next_ + static_cast<int64_t>(released_.size()); }

  // The caller checks free() > 0 first and reports what ran out.
  int32_t take() {
    if (!released_.empty()) {
      const int32_t id = released_.back();
      released_.pop_back();
      return id;
    }
    HLM_CHECK(next_ < capacity_, "id pool of {} ids is exhausted", capacity_);
    return static_cast<int32_t>(next_++);
  }
  void give(int32_t id) { released_.push_back(id); }

 private:
  int64_t capacity_;
  int64_t next_ = 0;  // ids >= next_ were never handed out
  std::vector<int32_t> released_;
};

}  // namespace hlm
