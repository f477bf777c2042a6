#include "runtime/step_plan.h"

#include <cstring>
#include <type_traits>

#include "base/error.h"

namespace hlm {

namespace {

class Writer {
 public:
  template <class T>
  void put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <class T>
  void put_vector(const std::vector<T>& v) {
    put<uint64_t>(v.size());
    if (!v.empty()) out_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(const std::string& in) : in_(in) {}
  template <class T>
  T get() {
    T v;
    need(sizeof(T));
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_vector() {
    const auto n = get<uint64_t>();
    need(n * sizeof(T));
    std::vector<T> v(n);
    if (n > 0) std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
    return v;
  }
  bool done() const { return pos_ == in_.size(); }

 private:
  void need(size_t n) const { HLM_CHECK(pos_ + n <= in_.size(), "step plan message truncated"); }
  const std::string& in_;
  size_t pos_ = 0;
};

}  // namespace

std::string StepPlan::serialize() const {
  Writer w;
  w.put<uint8_t>(stop);
  w.put_vector(synthetic);
  w.put<uint64_t>(entries.size());
  for (const StepEntry& e : entries) {
    w.put(e.seq_id);
    w.put<uint8_t>(e.is_new);
    w.put<uint8_t>(e.all_logits);
    w.put_vector(e.tokens);
  }
  w.put_vector(release);
  return w.take();
}

StepPlan StepPlan::deserialize(const std::string& bytes) {
  Reader r(bytes);
  StepPlan p;
  p.stop = r.get<uint8_t>() != 0;
  p.synthetic = r.get_vector<SyntheticSeq>();
  const auto n = r.get<uint64_t>();
  p.entries.resize(n);
  for (StepEntry& e : p.entries) {
    e.seq_id = r.get<int64_t>();
    e.is_new = r.get<uint8_t>() != 0;
    e.all_logits = r.get<uint8_t>() != 0;
    e.tokens = r.get_vector<int32_t>();
  }
  p.release = r.get_vector<int64_t>();
  HLM_CHECK(r.done(), "step plan message has trailing bytes");
  return p;
}

}  // namespace hlm
