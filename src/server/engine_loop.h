// EngineLoop: the hand-over between the HTTP threads and the one thread that drives the engine (rank 0's
// main thread, which is also the thread MPI was initialised on). HTTP handlers submit a request's
// sequences (one per choice) and get a RequestChannel back; the loop moves new sequences and cancellations
// into the Scheduler between steps, runs a step, and pushes each sequence's token into its request's
// channel. At most max_num_seqs + max_queued sequences are in flight: past that, submit() refuses at once
// (429) instead of growing a queue nobody bounds. Shutdown drains: once asked to stop, new requests are
// refused (503) and the loop returns when the admitted ones have finished; asked again, it fails those still
// open (503) and returns at once. An engine failure is fatal: every open request is failed, and run()
// rethrows.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runtime/scheduler.h"
#include "server/metrics.h"

namespace hlm {

using Clock = std::chrono::steady_clock;

// Why a request failed: the HTTP status and message its response carries.
struct RequestFailure {
  int status = 500;
  std::string message;
};

struct TimedOutput {
  int choice = 0;  // which of the request's sequences
  SeqOutput output;
  Clock::time_point time;
};

// One request's events, from the engine thread to its HTTP thread: the outputs of its sequences, engine
// ids first_id .. first_id + choices - 1, one per choice.
class RequestChannel {
 public:
  RequestChannel(int64_t first_id, int choices);
  int64_t id(int choice) const { return first_id_ + choice; }
  int choices() const { return choices_; }

  // Engine thread: an output of one of the request's sequences (by its id); the failure of the request.
  void push(const SeqOutput& output, Clock::time_point time);
  void fail(int status, const std::string& message);

  struct Events {
    std::vector<TimedOutput> outputs;
    bool finished = false;  // every sequence ended (a finish reason came), or the request failed
    std::optional<RequestFailure> error;  // why it failed
  };
  // HTTP thread: everything that arrived, waiting up to `timeout` for the first event.
  Events wait(std::chrono::milliseconds timeout);

 private:
  const int64_t first_id_;
  const int choices_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<TimedOutput> pending_;
  int ended_ = 0;  // sequences that ended
  bool finished_ = false;
  std::optional<RequestFailure> error_;
};

class EngineLoop {
 public:
  // stop_requests: how many times the server was told to stop (signals); must outlive the loop.
  EngineLoop(Scheduler& scheduler, Metrics& metrics, int32_t max_num_seqs, int32_t max_queued,
             const std::atomic<int>& stop_requests);

  // HTTP threads: a request's sequences, one per choice, admitted together or not at all. Throws ApiError
  // 429 when the server has no room for them, 400 when it never could, 503 once it is shutting down or
  // the engine has failed.
  std::shared_ptr<RequestChannel> submit(std::vector<SeqRequest> choices);
  // HTTP threads: the client left or a choice's text hit a stop string; frees the sequence (an id of
  // RequestChannel::id) within one step.
  void cancel(int64_t id);
  // Shutdown has begun (a stop was requested): submit() refuses.
  bool shutting_down() const { return stop_requests_.load() > 0; }

  // Engine thread: steps until told to stop. After the first stop request, new requests are refused at
  // once, and run() returns when every request admitted before has finished; after the second (seen
  // between steps, and at least every 50 ms while idle), the requests still open fail with 503 and run()
  // returns. Returns how many requests were cut short so.
  int64_t run();

 private:
  struct Incoming {
    std::shared_ptr<RequestChannel> channel;
    std::vector<SeqRequest> choices;
  };
  void take_requests(std::vector<Incoming>& incoming, std::vector<int64_t>& cancels);
  // Hands a new request's sequences to the scheduler; one it refuses fails the whole request.
  void admit(Incoming& in);
  void left(int64_t id);
  // Ends what is left of a failed request: its other sequences are cancelled.
  void drop(const RequestChannel& channel);
  void publish_gauges();
  // Fails every open request (running, queued, or not yet taken in); returns how many.
  int64_t fail_all(int status, const std::string& message);

  Scheduler& scheduler_;
  Metrics& metrics_;
  const int64_t max_in_flight_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Incoming> inbox_;
  std::vector<int64_t> cancels_;
  int64_t next_id_ = 0;
  int64_t in_flight_ = 0;
  bool failed_ = false;
  const std::atomic<int>& stop_requests_;
  bool drain_logged_ = false;

  // Engine thread only: sequence id -> its request's channel.
  std::map<int64_t, std::shared_ptr<RequestChannel>> channels_;
};

}  // namespace hlm
