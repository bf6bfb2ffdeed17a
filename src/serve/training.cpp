#include "training.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "lab/random.h"
#include "lab/train_model.h"
#include "params.h"

namespace sdpa::serve {

namespace {

namespace tr = lab::train;

// Stream ids of the runs (distinct ranges, as in the lab's training experiment).
constexpr std::uint64_t kInitStream = 1ULL << 40;   // + d: the initial parameters
constexpr std::uint64_t kBatchStream = 2ULL << 40;  // + step: training batch `step`
constexpr std::uint64_t kEvalStream = 3ULL << 40;   // the evaluation set
constexpr int kBatch = 32;
// 256 held-out sequences: the accuracy's standard error is at most 0.03, and one evaluation
// costs about as much as eight training steps.
constexpr int kEvalSize = 256;

tr::ScaleKind scale_kind(const std::string& name) {
  if (name == "1") return tr::ScaleKind::one;
  if (name == "1/d") return tr::ScaleKind::inv_d;
  if (name == "qk-norm") return tr::ScaleKind::qk_norm;
  return tr::ScaleKind::inv_sqrt_d;
}

template <class T>
bool all_finite(const std::vector<T>& x) {
  return std::all_of(x.begin(), x.end(), [](T v) { return std::isfinite(v); });
}

}  // namespace

TrainSpec read_train_spec(const json& body) {
  Params p(body);
  TrainSpec s;
  s.scale = p.choice("scale", {"1", "1/sqrt(d)", "1/d", "qk-norm"}, s.scale);
  s.d = p.integer("d", 1, 1024, s.d);
  s.optimizer = p.choice("optimizer", {"adam", "sgd"}, s.optimizer);
  s.lr = p.number("lr", 1e-6, 10, s.lr);
  s.steps = p.integer("steps", 1, 5000, s.steps);
  s.eval_every = p.integer("eval_every", 1, 1000, s.eval_every);
  s.seed = p.seed("seed", s.seed);
  p.finish();
  return s;
}

json to_json(const TrainPoint& p) {
  return {{"step", p.step},
          {"loss", num(p.loss)},
          {"accuracy", num(p.accuracy)},
          {"train_loss", num(p.train_loss)},
          {"entropy", num(p.entropy)},
          {"max_logit", num(p.max_logit)}};
}

const char* TrainRun::state_name(State s) {
  switch (s) {
    case State::running:
      return "running";
    case State::done:
      return "done";
    case State::stopped:
      return "stopped";
    case State::diverged:
      return "diverged";
    case State::failed:
      return "failed";
  }
  return "?";
}

TrainRun::TrainRun(std::int64_t id, std::string client, TrainSpec spec)
    : id_(id), client_(std::move(client)), spec_(std::move(spec)) {}

TrainRun::State TrainRun::wait(std::size_t seen, int timeout_ms, std::vector<TrainPoint>& out) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                    [&] { return points_.size() > seen || state_ != State::running; });
  out.assign(points_.begin() + static_cast<std::ptrdiff_t>(std::min(seen, points_.size())),
             points_.end());
  return state_;
}

json TrainRun::snapshot() {
  std::lock_guard lock(mutex_);
  json points = json::array();
  for (const TrainPoint& p : points_) points.push_back(to_json(p));
  return {{"id", id_},
          {"spec",
           {{"scale", spec_.scale},
            {"d", spec_.d},
            {"optimizer", spec_.optimizer},
            {"lr", spec_.lr},
            {"steps", spec_.steps},
            {"eval_every", spec_.eval_every},
            {"seed", spec_.seed}}},
          {"state", state_name(state_)},
          {"message", message_},
          {"seconds", seconds_},
          {"points", points}};
}

bool TrainRun::running() {
  std::lock_guard lock(mutex_);
  return state_ == State::running;
}

void TrainRun::push(const TrainPoint& p) {
  {
    std::lock_guard lock(mutex_);
    points_.push_back(p);
  }
  changed_.notify_all();
}

void TrainRun::finish(State s, const std::string& message) {
  {
    std::lock_guard lock(mutex_);
    state_ = s;
    message_ = message;
  }
  changed_.notify_all();
}

void TrainRun::train() {
  const auto t0 = std::chrono::steady_clock::now();
  State end = State::done;
  std::string message;
  try {
    const tr::ScaleKind kind = scale_kind(spec_.scale);
    const tr::TaskSpec task;
    const tr::ModelShape shape{task.n_keys, task.n_values, 32, spec_.d};
    lab::Stream init_stream(spec_.seed, kInitStream + static_cast<std::uint64_t>(spec_.d));
    tr::Params<float> params = tr::init_params<float>(shape, init_stream);
    tr::Params<float> grad(shape);
    tr::Adam<float> adam(params, spec_.lr);
    tr::Workspace<float> ws;
    lab::Stream eval_stream(spec_.seed, kEvalStream);
    const tr::Batch eval = tr::make_batch(task, kEvalSize, eval_stream);
    double train_loss_sum = 0;
    int train_loss_count = 0;
    for (int t = 0; t <= spec_.steps; ++t) {
      if (stop_) {
        end = State::stopped;
        break;
      }
      lab::Stream batch_stream(spec_.seed, kBatchStream + static_cast<std::uint64_t>(t));
      const tr::Batch batch = tr::make_batch(task, kBatch, batch_stream);
      const tr::Stats st = tr::forward_backward(params, kind, batch, &grad, false, ws);
      if (!std::isfinite(st.loss) || !all_finite(grad.wq) || !all_finite(grad.wk) ||
          !all_finite(grad.wv) || !all_finite(grad.wo) || !std::isfinite(grad.log_tau)) {
        end = State::diverged;
        break;
      }
      train_loss_sum += st.loss;
      ++train_loss_count;
      if (t % spec_.eval_every == 0 || t == spec_.steps) {
        const tr::Stats ev = tr::forward_backward<float>(params, kind, eval, nullptr, true, ws);
        push(
            {t, ev.loss, ev.accuracy, train_loss_sum / train_loss_count, ev.entropy, ev.max_logit});
        train_loss_sum = 0;
        train_loss_count = 0;
        if (!std::isfinite(ev.loss)) {
          end = State::diverged;
          break;
        }
      }
      if (t == spec_.steps) break;
      if (spec_.optimizer == "adam") {
        adam.step(params, grad);
      } else {
        const auto p = params.tensors(), g = grad.tensors();
        const auto sizes = params.sizes();
        const float lr = static_cast<float>(spec_.lr);
        for (std::size_t i = 0; i < p.size(); ++i) {
          for (std::size_t e = 0; e < sizes[i]; ++e) p[i][e] -= lr * g[i][e];
        }
      }
    }
  } catch (const std::exception& e) {
    end = State::failed;
    message = e.what();
  }
  {
    std::lock_guard lock(mutex_);
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  finish(end, message);
}

std::shared_ptr<TrainRun> TrainManager::start(const std::string& client, const TrainSpec& spec) {
  std::lock_guard lock(mutex_);
  if (closed_) throw Busy("the server is stopping");
  reap_locked();
  int running = 0;
  for (const auto& [id, run] : runs_) {
    if (!run->running()) continue;
    ++running;
    if (run->client() == client) {
      throw Busy(fmt::format("this client already runs training {}; stop it first", id));
    }
  }
  if (running >= max_runs_) {
    throw Busy(
        fmt::format("{} training runs are running, the most this server allows; try again "
                    "when one ends",
                    running));
  }
  auto run = std::make_shared<TrainRun>(next_id_++, client, spec);
  runs_[run->id()] = run;
  order_.push_back(run->id());
  threads_[run->id()] = std::thread([run] { run->train(); });
  return run;
}

std::shared_ptr<TrainRun> TrainManager::find(std::int64_t id) {
  std::lock_guard lock(mutex_);
  auto it = runs_.find(id);
  return it == runs_.end() ? nullptr : it->second;
}

int TrainManager::running() {
  std::lock_guard lock(mutex_);
  int n = 0;
  for (const auto& [id, run] : runs_) n += run->running();
  return n;
}

void TrainManager::reap_locked() {
  // Join the threads of ended runs (they have returned or are returning), then forget the
  // oldest ended runs beyond kKeptRuns.
  for (auto it = threads_.begin(); it != threads_.end();) {
    if (!runs_.at(it->first)->running()) {
      it->second.join();
      it = threads_.erase(it);
    } else {
      ++it;
    }
  }
  std::size_t ended = 0;
  for (const auto& [id, run] : runs_) ended += !run->running();
  for (auto it = order_.begin(); it != order_.end() && ended > kKeptRuns;) {
    auto run = runs_.at(*it);
    if (!run->running() && !threads_.count(*it)) {
      runs_.erase(*it);
      it = order_.erase(it);
      --ended;
    } else {
      ++it;
    }
  }
}

void TrainManager::shutdown() {
  std::map<std::int64_t, std::thread> threads;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    for (auto& [id, run] : runs_) run->request_stop();
    threads.swap(threads_);
  }
  for (auto& [id, t] : threads) t.join();
}

}  // namespace sdpa::serve
