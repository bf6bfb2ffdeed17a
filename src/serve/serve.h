// `sdpa serve`: a local web page for learners where the sqrt(d) argument moves under the
// reader's hands. Every number on the page is computed here, by the library, for each change:
//
//   POST /api/scores    panel 1: the histogram of scaled q.k against its closed form, one row's
//                       softmax (entropy against ln N, max probability, Jacobian norm) and the
//                       per-row gradient sizes with the dead fraction
//   POST /api/softmax   panel 2: stable and naive softmax in float16, bfloat16, float32 and
//                       float64 (emulated rounding), and the gradient reaching each logit
//   POST /api/train/start, /api/train/stop, GET /api/train/events (server-sent events),
//        GET /api/train/run                panel 3: small C8 training runs, streamed live
//   POST /api/freeze    panel 4: attention entropy over (d, N) with the theory's boundary
//   GET  /api/info      the parameters' ranges and defaults
//
// Every compute function takes the request's JSON object and returns the response's; a bad
// parameter throws ParamError, which the server answers with HTTP 400 and
// {"error": message, "parameter": name}. docs/serve.md describes each field.
#pragma once

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "sdpa/sdpa.h"

namespace sdpa::serve {

using json = nlohmann::json;

/// A request parameter that is missing, of the wrong type or out of range.
class ParamError : public sdpa::Error {
 public:
  ParamError(std::string parameter, const std::string& message)
      : sdpa::Error(message), parameter_(std::move(parameter)) {}
  const std::string& parameter() const { return parameter_; }

 private:
  std::string parameter_;
};

/// Panel 1 (POST /api/scores).
json compute_scores(const json& request);
/// Panel 2 (POST /api/softmax).
json compute_softmax(const json& request);
/// Panel 4 (POST /api/freeze).
json compute_freeze(const json& request);
/// The ranges and defaults of every parameter (GET /api/info).
json parameter_info();

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  ///< 0: any free port
  std::string lang = "en";
  int max_runs = 2;     ///< training runs at once, over all clients
  int max_streams = 8;  ///< open event streams at once
  int threads = 16;     ///< worker threads answering requests
};

/// Binds, calls `on_listening(port)` once the socket accepts connections, and serves until
/// SIGINT or SIGTERM arrives (or `stop_server()` is called). Throws sdpa::Error when the
/// address cannot be bound. Running training runs are stopped and joined before it returns.
void run_server(const ServeOptions& options, const std::function<void(int port)>& on_listening);

/// Asks a running run_server to return (safe from any thread).
void stop_server();

}  // namespace sdpa::serve
