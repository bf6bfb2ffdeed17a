// Panel 3: small C8 training runs (src/lab/train_model.h: associative recall through one
// attention layer), each on its own thread, their evaluation points kept for the event stream.
//
// Limits: at most one running run per client, at most `max_runs` running overall, and the last
// kKeptRuns finished runs kept for replay. A request beyond a limit gets Busy.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "serve.h"

namespace sdpa::serve {

struct TrainSpec {
  std::string scale = "1/sqrt(d)";  // 1, 1/sqrt(d), 1/d, qk-norm
  int d = 64;
  std::string optimizer = "adam";  // adam, sgd
  double lr = 1e-2;
  int steps = 300;
  int eval_every = 10;
  std::uint64_t seed = 1;
};
/// Reads and checks a start request (ParamError names the bad field).
TrainSpec read_train_spec(const json& body);

struct TrainPoint {
  int step = 0;
  double loss = 0, accuracy = 0, train_loss = 0, entropy = 0, max_logit = 0;
};
json to_json(const TrainPoint& p);

class Busy : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class TrainRun {
 public:
  enum class State { running, done, stopped, diverged, failed };
  static const char* state_name(State s);

  TrainRun(std::int64_t id, std::string client, TrainSpec spec);
  std::int64_t id() const { return id_; }
  const std::string& client() const { return client_; }
  const TrainSpec& spec() const { return spec_; }

  void request_stop() { stop_ = true; }
  /// Waits until more than `seen` points exist, the run has ended, or `timeout_ms` passed;
  /// copies the points from `seen` on into `out` and returns the state then.
  State wait(std::size_t seen, int timeout_ms, std::vector<TrainPoint>& out);
  /// Everything so far, as {"id", "spec", "state", "points", "seconds"}.
  json snapshot();
  bool running();

  /// The training loop (runs on the run's thread).
  void train();

 private:
  void push(const TrainPoint& p);
  void finish(State s, const std::string& message = "");

  const std::int64_t id_;
  const std::string client_;
  const TrainSpec spec_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<TrainPoint> points_;
  State state_ = State::running;
  std::string message_;
  double seconds_ = 0;
};

class TrainManager {
 public:
  explicit TrainManager(int max_runs) : max_runs_(max_runs) {}
  ~TrainManager() { shutdown(); }

  /// Starts a run for `client`; throws Busy when the client already runs one or the server
  /// runs max_runs.
  std::shared_ptr<TrainRun> start(const std::string& client, const TrainSpec& spec);
  /// The run `id`, or nullptr.
  std::shared_ptr<TrainRun> find(std::int64_t id);
  /// Stops every run and joins the threads.
  void shutdown();
  int running();

  static constexpr std::size_t kKeptRuns = 32;

 private:
  void reap_locked();

  const int max_runs_;
  std::mutex mutex_;
  std::int64_t next_id_ = 1;
  std::map<std::int64_t, std::shared_ptr<TrainRun>> runs_;
  std::map<std::int64_t, std::thread> threads_;
  std::deque<std::int64_t> order_;
  bool closed_ = false;
};

}  // namespace sdpa::serve
