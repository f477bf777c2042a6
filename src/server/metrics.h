// Serving metrics in the Prometheus text format (GET /metrics), named like vLLM's with a `helixlm:`
// prefix: requests by HTTP status, prompt and generated tokens, time-to-first-token, inter-token and
// end-to-end latency histograms, running and waiting sequences, KV pages used and free. Written by the
// HTTP threads and the engine loop, read by the scraper; one mutex guards them all (updates are a few
// per token, far from contention).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace hlm {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Cumulative buckets, _sum and _count lines for metric `name`.
  std::string render(const std::string& name) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // one per bound, plus +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

struct EngineGauges {
  int64_t running = 0;
  int64_t waiting = 0;
  int64_t kv_pages_used = 0;
  int64_t kv_pages_free = 0;
};

class Metrics {
 public:
  Metrics();

  void count_response(int status);
  void count_finished(const std::string& finish_reason);
  void add_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double seconds);
  void observe_itl(double seconds);
  void observe_e2e(double seconds);
  void set_gauges(const EngineGauges& g);
  EngineGauges gauges() const;

  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::map<int, uint64_t> responses_;
  std::map<std::string, uint64_t> finished_;
  uint64_t prompt_tokens_ = 0;
  uint64_t generated_tokens_ = 0;
  Histogram ttft_;
  Histogram itl_;
  Histogram e2e_;
  EngineGauges gauges_;
};

}  // namespace hlm
