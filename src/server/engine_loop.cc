#include "server/engine_loop.h"

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"

namespace hlm {

void RequestChannel::push(const SeqOutput& output, Clock::time_point time) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(TimedOutput{output, time});
    if (output.finish != FinishReason::kNone) finished_ = true;
  }
  cv_.notify_one();
}

void RequestChannel::fail(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = message;
    finished_ = true;
  }
  cv_.notify_one();
}

RequestChannel::Events RequestChannel::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !pending_.empty() || finished_; });
  Events e;
  e.outputs.swap(pending_);
  e.finished = finished_;
  e.error = error_;
  return e;
}

EngineLoop::EngineLoop(Scheduler& scheduler, Metrics& metrics, int32_t max_num_seqs, int32_t max_queued)
    : scheduler_(scheduler),
      metrics_(metrics),
      max_in_flight_(static_cast<int64_t>(max_num_seqs) + max_queued) {
  HLM_CHECK(max_queued >= 0, "--max-queued-requests must be >= 0 (got {})", max_queued);
  publish_gauges();
}

std::shared_ptr<RequestChannel> EngineLoop::submit(SeqRequest request) {
  std::shared_ptr<RequestChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) throw ApiError(503, "the engine has failed; the server is shutting down");
    if (in_flight_ >= max_in_flight_) {
      throw ApiError(429,
                     fmt::format("the server is full: {} requests are running or queued (--max-num-seqs plus "
                                 "--max-queued-requests); retry later",
                                 in_flight_));
    }
    ++in_flight_;
    channel = std::make_shared<RequestChannel>(next_id_++);
    inbox_.push_back(Incoming{channel, std::move(request)});
  }
  cv_.notify_one();
  return channel;
}

void EngineLoop::cancel(int64_t id) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancels_.push_back(id);
  }
  cv_.notify_one();
}

void EngineLoop::take_requests(std::vector<Incoming>& incoming, std::vector<int64_t>& cancels) {
  std::lock_guard<std::mutex> lock(mutex_);
  while (!inbox_.empty()) {
    incoming.push_back(std::move(inbox_.front()));
    inbox_.pop_front();
  }
  cancels.swap(cancels_);
}

void EngineLoop::left(int64_t id) {
  channels_.erase(id);
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

void EngineLoop::publish_gauges() {
  int64_t queued = scheduler_.num_waiting();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued += static_cast<int64_t>(inbox_.size());
  }
  metrics_.set_gauges(EngineGauges{scheduler_.num_running(), queued,
                                   scheduler_.pages_total() - scheduler_.pages_free(),
                                   scheduler_.pages_free()});
}

void EngineLoop::run(const std::atomic<bool>& stop) {
  try {
    while (!stop.load()) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait_for(lock, std::chrono::milliseconds(50),
                     [&] { return !inbox_.empty() || !cancels_.empty() || scheduler_.has_work(); });
      }
      std::vector<Incoming> incoming;
      std::vector<int64_t> cancels;
      take_requests(incoming, cancels);
      for (Incoming& in : incoming) {
        const int64_t id = in.channel->id();
        channels_[id] = in.channel;
        try {
          scheduler_.add(id, std::move(in.request));
        } catch (const Error& e) {
          // The HTTP side validates first; this is the last line, and it only refuses this request.
          in.channel->fail(e.what());
          left(id);
        }
      }
      for (int64_t id : cancels) {
        if (channels_.count(id) == 0) continue;  // it ended on its own meanwhile
        scheduler_.cancel(id);
        left(id);
      }
      if (scheduler_.has_work()) {
        std::vector<SeqOutput> outputs = scheduler_.step();
        const Clock::time_point now = Clock::now();
        // Before the outputs go out, so a client never sees a token the gauges do not account for yet.
        publish_gauges();
        for (const SeqOutput& o : outputs) {
          auto it = channels_.find(o.id);
          if (it == channels_.end()) continue;
          if (o.finish == FinishReason::kError) {
            it->second->fail(o.error);  // this request fails; the others go on
          } else {
            it->second->push(o, now);
          }
          if (o.finish != FinishReason::kNone) left(o.id);
        }
      }
      publish_gauges();
    }
  } catch (const std::exception& e) {
    spdlog::error("engine loop failed: {}", e.what());
    const std::string message = fmt::format("the engine failed: {}", e.what());
    for (auto& [id, channel] : channels_) channel->fail(message);
    std::lock_guard<std::mutex> lock(mutex_);
    failed_ = true;
    for (Incoming& in : inbox_) in.channel->fail(message);
    throw;
  }
}

}  // namespace hlm
