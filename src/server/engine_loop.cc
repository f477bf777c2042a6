#include "server/engine_loop.h"

#include "base/error.h"
#include "base/log.h"
#include "server/api_error.h"

namespace hlm {

RequestChannel::RequestChannel(int64_t first_id, int choices) : first_id_(first_id), choices_(choices) {
  HLM_CHECK(choices >= 1, "a request of {} sequences", choices);
}

void RequestChannel::push(const SeqOutput& output, Clock::time_point time) {
  const int64_t choice = output.id - first_id_;
  HLM_CHECK(choice >= 0 && choice < choices_, "sequence {} is not one of request {}'s {} sequences",
            output.id, first_id_, choices_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending_.push_back(TimedOutput{static_cast<int>(choice), output, time});
    if (output.finish != FinishReason::kNone && ++ended_ == choices_) finished_ = true;
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

std::shared_ptr<RequestChannel> EngineLoop::submit(std::vector<SeqRequest> choices) {
  const auto k = static_cast<int64_t>(choices.size());
  HLM_CHECK(k >= 1, "a request of no sequences");
  if (k > max_in_flight_) {
    throw ApiError(400, fmt::format("this request needs {} sequences; the server runs and queues at most {} "
                                    "at once (--max-num-seqs plus --max-queued-requests)",
                                    k, max_in_flight_));
  }
  std::shared_ptr<RequestChannel> channel;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failed_) throw ApiError(503, "the engine has failed; the server is shutting down");
    // Read under the mutex, as run() does: a request either counts in in_flight_ before run() sees the
    // stop, or is refused here.
    if (shutting_down()) throw ApiError(503, "the server is shutting down; it takes no new requests");
    if (in_flight_ + k > max_in_flight_) {
      throw ApiError(429, fmt::format("the server is full: {} sequences are running or queued of at most {} "
                                      "(--max-num-seqs plus --max-queued-requests), and this request needs "
                                      "{}; retry later",
                                      in_flight_, max_in_flight_, k));
    }
    in_flight_ += k;
    channel = std::make_shared<RequestChannel>(next_id_, static_cast<int>(k));
    next_id_ += k;
    inbox_.push_back(Incoming{channel, std::move(choices)});
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

void EngineLoop::admit(Incoming& in) {
  const RequestChannel& ch = *in.channel;
  for (int c = 0; c < ch.choices(); ++c) channels_[ch.id(c)] = in.channel;
  for (int c = 0; c < ch.choices(); ++c) {
    try {
      scheduler_.add(ch.id(c), std::move(in.choices[c]));
    } catch (const Error& e) {
      // The HTTP side validates first; this is the last line, and it only refuses this request.
      in.channel->fail(400, e.what());
      drop(ch);
      return;
    }
  }
}

void EngineLoop::left(int64_t id) {
  if (channels_.erase(id) == 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

void EngineLoop::drop(const RequestChannel& channel) {
  for (int c = 0; c < channel.choices(); ++c) {
    if (channels_.count(channel.id(c)) == 0) continue;
    scheduler_.cancel(channel.id(c));  // ignored for a sequence not added yet
    left(channel.id(c));
  }
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
  const RequestChannel* last = nullptr;
  for (auto& [id, channel] : channels_) {
    // A request's sequences have consecutive ids, so its entries are neighbours in the map.
    if (channel.get() == last) continue;
    last = channel.get();
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
      for (Incoming& in : incoming) admit(in);
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
            // This request fails, its other choices with it; the other requests go on.
            const std::shared_ptr<RequestChannel> channel = it->second;
            channel->fail(500, o.error);
            drop(*channel);
            continue;
          }
          it->second->push(o, now);
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
