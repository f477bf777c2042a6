#include "server/metrics.h"

#include <fmt/format.h>

namespace hlm {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

std::string Histogram::render(const std::string& name) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", name, count_);
  out += fmt::format("{}_sum {}\n{}_count {}\n", name, sum_, name, count_);
  return out;
}

namespace {

// Seconds: vLLM's edges, plus sub-millisecond ones that the CPU test models need.
const std::vector<double> kTtftBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02,
                                         0.04,   0.06,    0.08,   0.1,   0.25,   0.5,   0.75, 1.0,
                                         2.5,    5.0,     7.5,    10.0,  20.0,   40.0,  80.0};
const std::vector<double> kItlBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.075,  0.1,   0.15,   0.2,   0.3,
                                        0.4,    0.5,     0.75,   1.0,   2.5,    5.0};
const std::vector<double> kE2eBounds = {0.3, 0.5,  0.8,  1.0,  1.5,  2.0,  2.5,
                                        5.0, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0};

std::string header(const std::string& name, const char* type, const char* help) {
  return fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
}

}  // namespace

Metrics::Metrics() : ttft_(kTtftBounds), itl_(kItlBounds), e2e_(kE2eBounds) {}

void Metrics::count_response(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++responses_[status];
}

void Metrics::count_finished(const std::string& finish_reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++finished_[finish_reason];
}

void Metrics::add_tokens(int64_t prompt, int64_t generated) {
  std::lock_guard<std::mutex> lock(mutex_);
  prompt_tokens_ += static_cast<uint64_t>(prompt);
  generated_tokens_ += static_cast<uint64_t>(generated);
}

void Metrics::observe_ttft(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  ttft_.observe(seconds);
}

void Metrics::observe_itl(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  itl_.observe(seconds);
}

void Metrics::observe_e2e(double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  e2e_.observe(seconds);
}

void Metrics::set_gauges(const EngineGauges& g) {
  std::lock_guard<std::mutex> lock(mutex_);
  gauges_ = g;
}

EngineGauges Metrics::gauges() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gauges_;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  out += header("helixlm:requests_total", "counter", "HTTP responses of the API endpoints, by status code.");
  for (const auto& [status, n] : responses_)
    out += fmt::format("helixlm:requests_total{{status=\"{}\"}} {}\n", status, n);
  out += header("helixlm:requests_finished_total", "counter",
                "Generation requests finished, by finish reason (each choice of a request counts once).");
  for (const auto& [reason, n] : finished_) {
    out += fmt::format("helixlm:requests_finished_total{{finish_reason=\"{}\"}} {}\n", reason, n);
  }
  out += header("helixlm:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.");
  out += fmt::format("helixlm:prompt_tokens_total {}\n", prompt_tokens_);
  out += header("helixlm:generation_tokens_total", "counter", "Tokens generated.");
  out += fmt::format("helixlm:generation_tokens_total {}\n", generated_tokens_);
  out += header("helixlm:time_to_first_token_seconds", "histogram", "Time from arrival to the first token.");
  out += ttft_.render("helixlm:time_to_first_token_seconds");
  out += header("helixlm:inter_token_latency_seconds", "histogram",
                "Time between consecutive tokens of a request.");
  out += itl_.render("helixlm:inter_token_latency_seconds");
  out += header("helixlm:e2e_request_latency_seconds", "histogram", "Time from arrival to the last token.");
  out += e2e_.render("helixlm:e2e_request_latency_seconds");
  out += header("helixlm:num_requests_running", "gauge", "Sequences in the running batch.");
  out += fmt::format("helixlm:num_requests_running {}\n", gauges_.running);
  out +=
      header("helixlm:num_requests_waiting", "gauge", "Accepted requests waiting for a slot and KV pages.");
  out += fmt::format("helixlm:num_requests_waiting {}\n", gauges_.waiting);
  out += header("helixlm:kv_pages_used", "gauge", "MLA KV cache pages in use on rank 0.");
  out += fmt::format("helixlm:kv_pages_used {}\n", gauges_.kv_pages_used);
  out += header("helixlm:kv_pages_free", "gauge", "MLA KV cache pages free on rank 0.");
  out += fmt::format("helixlm:kv_pages_free {}\n", gauges_.kv_pages_free);
  return out;
}

}  // namespace hlm
