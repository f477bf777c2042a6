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

void RequestChannel::fail(int status, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = RequestFailure{status, message};
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

EngineLoop::EngineLoop(Scheduler& scheduler, Metrics& metrics, int32_t max_num_seqs, int32_t max_queued,
                       const std::atomic<int>& stop_requests)
    : scheduler_(scheduler),
      metrics_(metrics),
      max_in_flight_(static_cast<int64_t>(max_num_seqs) + max_queued),
      stop_requests_(stop_requests) {
  HLM_CHECK(max_queued >= 0, "--max-queued-requests must be >= 0 (got {})", max_queued);
  publish_gauges();
}

std::shared_ptr<RequestChannel> EngineLoop::submit(SeqRequest request) {
  std::shared_ptr<RequestChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) throw ApiError(503, "the engine has failed; the server is shutting down");
    // Read under the mutex, as run() does: a request either counts in in_flight_ before run() sees the
    // stop, or is refused here.
    if (shutting_down()) throw ApiError(503, "the server is shutting down; it takes no new requests");
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

int64_t EngineLoop::fail_all(int status, const std::string& message) {
  int64_t n = 0;
  for (auto& [id, channel] : channels_) {
    channel->fail(status, message);
    ++n;
  }
  channels_.clear();
  std::lock_guard<std::mutex> lock(mutex_);
  for (Incoming& in : inbox_) {
    in.channel->fail(status, message);
    ++n;
  }
  inbox_.clear();
  in_flight_ = 0;
  return n;
}

int64_t EngineLoop::run() {
  try {
    for (;;) {
      int stops = 0;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stops = stop_requests_.load();
        if (stops >= 1 && in_flight_ == 0) return 0;
        if (stops >= 1 && !drain_logged_) {
          spdlog::info(
              "shutting down: no new requests; {} running or queued finish first (signal again to "
              "end them now)",
              in_flight_);
          drain_logged_ = true;
        }
      }
      if (stops >= 2) {
        const int64_t cut = fail_all(503, "the server was stopped before this request finished");
        spdlog::warn("stopped at once: {} requests cut short", cut);
        return cut;
      }
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
          in.channel->fail(400, e.what());
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
            it->second->fail(500, o.error);  // this request fails; the others go on
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
    {
      // First, so no request can slip into the inbox after fail_all has emptied it.
      std::lock_guard<std::mutex> lock(mutex_);
      failed_ = true;
    }
    fail_all(500, fmt::format("the engine failed: {}", e.what()));
    throw;
  }
}

}  // namespace hlm
