// The Prometheus text: cumulative histogram buckets, counters by label, gauges.
#include "server/metrics.h"

#include <gtest/gtest.h>

namespace hlm {
namespace {

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.5);
  h.observe(0.5);
  h.observe(7.0);
  EXPECT_EQ(h.render("x"),
            "x_bucket{le=\"0.1\"} 1\nx_bucket{le=\"1\"} 3\nx_bucket{le=\"+Inf\"} 4\nx_sum 8.05\nx_count 4\n");
}

TEST(Metrics, RenderHasEveryFamily) {
  Metrics m;
  m.count_response(200);
  m.count_response(429);
  m.count_response(200);
  m.count_finished("stop");
  m.add_tokens(10, 3);
  m.observe_ttft(0.02);
  m.observe_itl(0.004);
  m.set_gauges(EngineGauges{2, 5, 7, 9});
  const std::string text = m.render();
  for (const char* line :
       {"helixlm:requests_total{status=\"200\"} 2\n", "helixlm:requests_total{status=\"429\"} 1\n",
        "helixlm:requests_finished_total{finish_reason=\"stop\"} 1\n", "helixlm:prompt_tokens_total 10\n",
        "helixlm:generation_tokens_total 3\n", "helixlm:time_to_first_token_seconds_count 1\n",
        "helixlm:inter_token_latency_seconds_count 1\n", "helixlm:num_requests_running 2\n",
        "helixlm:num_requests_waiting 5\n", "helixlm:kv_pages_used 7\n", "helixlm:kv_pages_free 9\n",
        "# TYPE helixlm:time_to_first_token_seconds histogram\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace hlm
