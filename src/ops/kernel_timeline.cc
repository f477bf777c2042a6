#include "ops/kernel_timeline.h"

#include <cxxabi.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>

#include "base/error.h"
#include "base/log.h"

namespace hlm {

TimelineSummary summarize_timeline(std::vector<KernelSpan> spans, size_t top) {
  TimelineSummary s;
  s.kernels = spans.size();
  if (spans.empty()) return s;
  std::sort(spans.begin(), spans.end(),
            [](const KernelSpan& a, const KernelSpan& b) { return a.start_ns < b.start_ns; });
  uint64_t covered_to = spans[0].start_ns, busy = 0;
  const KernelSpan* last_ending = &spans[0];  // the span that reaches covered_to
  for (const KernelSpan& k : spans) {
    s.kernel_sum_us += static_cast<double>(k.end_ns - k.start_ns) / 1e3;
    if (k.start_ns > covered_to) {
      s.longest_gaps.push_back(TimelineGap{static_cast<double>(k.start_ns - covered_to) / 1e3,
                                           short_kernel_name(last_ending->name), short_kernel_name(k.name)});
    }
    const uint64_t from = std::max(k.start_ns, covered_to);
    if (k.end_ns > from) busy += k.end_ns - from;
    if (k.end_ns > covered_to) {
      covered_to = k.end_ns;
      last_ending = &k;
    }
  }
  s.span_us = static_cast<double>(covered_to - spans[0].start_ns) / 1e3;
  s.busy_us = static_cast<double>(busy) / 1e3;

  std::sort(spans.begin(), spans.end(), [](const KernelSpan& a, const KernelSpan& b) {
    return a.end_ns != b.end_ns ? a.end_ns < b.end_ns : a.start_ns < b.start_ns;
  });
  std::map<std::string, KernelShare> shares;
  uint64_t latest_end = 0;
  for (const KernelSpan& k : spans) {
    KernelShare& share = shares[short_kernel_name(k.name)];
    ++share.calls;
    share.kernel_us += static_cast<double>(k.end_ns - k.start_ns) / 1e3;
    const uint64_t from = std::max(k.start_ns, latest_end);
    if (k.end_ns > from) share.extend_us += static_cast<double>(k.end_ns - from) / 1e3;
    latest_end = std::max(latest_end, k.end_ns);
  }
  for (auto& [name, share] : shares) {
    share.name = name;
    s.shares.push_back(share);
  }
  std::stable_sort(s.shares.begin(), s.shares.end(),
                   [](const KernelShare& a, const KernelShare& b) { return a.extend_us > b.extend_us; });
  std::stable_sort(s.longest_gaps.begin(), s.longest_gaps.end(),
                   [](const TimelineGap& a, const TimelineGap& b) { return a.us > b.us; });
  if (s.longest_gaps.size() > top) s.longest_gaps.resize(top);
  return s;
}

nlohmann::json chrome_trace(const std::vector<KernelSpan>& spans) {
  uint64_t t0 = UINT64_MAX;
  for (const KernelSpan& k : spans) t0 = std::min(t0, k.start_ns);
  nlohmann::json events = nlohmann::json::array();
  for (const KernelSpan& k : spans) {
    events.push_back({{"name", short_kernel_name(k.name)},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", k.stream},
                      {"ts", static_cast<double>(k.start_ns - t0) / 1e3},
                      {"dur", static_cast<double>(k.end_ns - k.start_ns) / 1e3},
                      {"args", {{"grid", k.grid}, {"block", k.block}, {"symbol", k.name}}}});
  }
  return {{"traceEvents", events}, {"displayTimeUnit", "ns"}};
}

std::string short_kernel_name(const std::string& mangled) {
  // Only symbols (_Z...): the demangler also reads type encodings, which would turn a kernel named "d" into
  // "double".
  std::string name = mangled;
  if (mangled.rfind("_Z", 0) == 0) {
    int status = 0;
    std::unique_ptr<char, void (*)(void*)> demangled(
        abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status), std::free);
    if (status == 0 && demangled) name = demangled.get();
  }
  // The argument list: the first '(' outside template arguments that is not "(anonymous namespace)".
  int depth = 0;
  size_t args = std::string::npos;
  for (size_t i = 0; i < name.size() && args == std::string::npos; ++i) {
    const char c = name[i];
    if (c == '<') ++depth;
    if (c == '>') --depth;
    if (c == '(' && depth == 0 && name.compare(i, 21, "(anonymous namespace)") != 0) args = i;
  }
  if (args != std::string::npos) name.resize(args);
  // Template arguments of the last component, then its qualification.
  depth = 0;
  for (size_t i = name.size(); i-- > 0;) {
    if (name[i] == '>') ++depth;
    if (name[i] == '<' && --depth == 0) {
      name.resize(i);
      break;
    }
    if (depth == 0 && name[i] != '>') break;
  }
  // The qualification and, for a function template, the return type before it.
  const size_t colon = name.rfind("::"), space = name.rfind(' ');
  size_t from = 0;
  if (colon != std::string::npos) from = colon + 2;
  if (space != std::string::npos && space + 1 > from) from = space + 1;
  return name.substr(from);
}

void write_kernel_trace(const std::string& path, const std::vector<KernelSpan>& spans) {
  std::ofstream out(path);
  HLM_CHECK(out.good(), "--kernel-trace: cannot write {}", path);
  out << chrome_trace(spans).dump() << "\n";
  HLM_CHECK(out.good(), "--kernel-trace: writing {} failed", path);
  const TimelineSummary s = summarize_timeline(spans, 8);
  spdlog::info(
      "kernel trace: {} kernels over {:.1f} µs: busy {:.1f} µs ({:.0f}%), idle {:.1f} µs, kernel time "
      "{:.1f} µs; written to {}",
      s.kernels, s.span_us, s.busy_us, s.span_us > 0 ? 100.0 * s.busy_us / s.span_us : 0.0,
      s.span_us - s.busy_us, s.kernel_sum_us, path);
  for (const TimelineGap& g : s.longest_gaps)
    spdlog::info("kernel trace:   idle {:.2f} µs after {} before {}", g.us, g.before, g.after);
  spdlog::info("kernel trace: {:<40} {:>6} {:>12} {:>12} {:>7}", "kernel", "calls", "extends µs", "runs µs",
               "share");
  for (const KernelShare& k : s.shares) {
    spdlog::info("kernel trace: {:<40} {:>6} {:>12.1f} {:>12.1f} {:>6.1f}%", k.name.substr(0, 40), k.calls,
                 k.extend_us, k.kernel_us, s.busy_us > 0 ? 100.0 * k.extend_us / s.busy_us : 0.0);
  }
}

}  // namespace hlm
