// The HTTP side of `sdpa serve` (cpp-httplib): routes, limits, and the signal-driven stop.
//
// Limits, each with the answer beyond it:
//   request bodies      kMaxBody bytes, with a Content-Length  413, JSON (a body without its
//                       length, Transfer-Encoding: chunked: 411, before any byte of it is read)
//   compute requests    one at a time through compute_gate    (they queue; each is bounded)
//   training runs       one per client, max_runs overall      429 {"busy": ...}
//   event streams       max_streams open at once              429 {"busy": ...}
//   static files        the embedded set only                 404
#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "params.h"
#include "serve.h"
#include "training.h"

namespace sdpa::serve {

const std::map<std::string, std::string_view>& embedded_assets();

namespace {

// 64 KiB: the largest legitimate body, a playground row of 64 logits, is under 2 KiB.
constexpr std::size_t kMaxBody = 64 * 1024;
// Pending connections the kernel queues before the accept loop takes them.
constexpr int kBacklog = 1024;

std::atomic<bool> g_stop_requested{false};

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_header("Cache-Control", "no-store");
  // Invalid UTF-8 (echoed from a bad body in a parser's message) is replaced, not thrown.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

json error_body(const std::string& message, const json& parameter = nullptr) {
  return {{"error", message}, {"parameter", parameter}};
}

// The client a training run belongs to: the page's per-tab id when it sends a well-formed one,
// else the peer address.
std::string client_of(const httplib::Request& req) {
  const std::string id = req.get_header_value("X-Sdpa-Client");
  bool ok = !id.empty() && id.size() <= 64;
  for (char c : id)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  return ok ? "id:" + id : "addr:" + req.remote_addr;
}

json parse_body(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  try {
    return json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw ParamError("body", std::string("the request body is not valid JSON: ") + e.what());
  } catch (const json::exception& e) {  // a number past double's range (1e400)
    throw ParamError("body",
                     std::string("the request body holds a value JSON cannot carry: ") + e.what());
  }
}

// Runs `fn` and turns its exceptions into the JSON answers of the table above.
template <class Fn>
void guarded(httplib::Response& res, Fn&& fn) {
  try {
    reply(res, 200, fn());
  } catch (const ParamError& e) {
    reply(res, 400, error_body(e.what(), e.parameter()));
  } catch (const Busy& e) {
    reply(res, 429, {{"error", e.what()}, {"busy", true}});
  } catch (const sdpa::Error& e) {
    reply(res, 400, error_body(e.what()));
  } catch (const std::bad_alloc&) {
    reply(res, 503, error_body("out of memory"));
  } catch (const std::exception& e) {
    reply(res, 500, error_body(e.what()));
  }
}

std::int64_t run_id(const json& v, const char* name) {
  // 1.0 is accepted as 1, as for every other integer parameter.
  if (!integral_number(v) || v.get<double>() < 1) {
    throw ParamError(name,
                     std::string(name) + " must be a positive integer run id, got " + v.dump());
  }
  return v.is_number_integer() ? v.get<std::int64_t>() : static_cast<std::int64_t>(v.get<double>());
}

std::int64_t query_id(const httplib::Request& req) {
  const std::string text = req.get_param_value("id");
  std::int64_t id = 0;
  bool ok = !text.empty() && text.size() < 18;
  for (char c : text) ok = ok && c >= '0' && c <= '9';
  if (ok) id = std::stoll(text);
  if (!ok || id < 1)
    throw ParamError("id",
                     "id must be a positive integer run id, got \"" + text.substr(0, 20) + "\"");
  return id;
}

const char* mime_of(const std::string& name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  return "application/octet-stream";
}

}  // namespace

void stop_server() { g_stop_requested = true; }

void run_server(const ServeOptions& options, const std::function<void(int port)>& on_listening) {
  if (options.lang != "en" && options.lang != "zh") {
    throw sdpa::Error("--lang must be en or zh, got " + options.lang);
  }
  if (options.port < 0 || options.port > 65535) {
    throw sdpa::Error("--port must be in [0, 65535], got " + std::to_string(options.port));
  }
  g_stop_requested = false;

  // SIGINT and SIGTERM set a flag that a watcher thread turns into svr.stop(). A handler,
  // not a blocked mask: threads that exist before this call (OpenBLAS starts its pool when
  // the library loads) would take a blocked signal's default action and end the process.
  struct sigaction action {
  }, old_int{}, old_term{};
  action.sa_handler = [](int) { g_stop_requested = true; };
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  auto restore_signals = [&] {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  };

  TrainManager trainer(options.max_runs);
  std::atomic<int> streams{0};
  std::mutex compute_gate;
  httplib::Server svr;
  const int threads = options.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr.set_payload_max_length(kMaxBody);
  // SO_REUSEADDR only: httplib's default adds SO_REUSEPORT, with which a second server would
  // bind the same port and share its connections instead of failing.
  int listen_fd = -1;
  svr.set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd = sock;
  });
  svr.set_keep_alive_timeout(
      1);  // seconds an idle connection holds a worker; also the longest stop
  svr.set_read_timeout(5);
  svr.set_write_timeout(5);
  // The page loads nothing from elsewhere; the policy makes the browser refuse if it tried.
  svr.set_default_headers({{"X-Content-Type-Options", "nosniff"},
                           {"Content-Security-Policy",
                            "default-src 'self'; img-src 'self' data:; style-src 'self'; "
                            "connect-src 'self'; frame-ancestors 'none'"}});
  // The body limit above holds only for bodies that state their length: a chunked body would
  // be read whole, whatever its size. Such requests are answered before their body is read,
  // and their connection closed (the unread body cannot be skipped).
  svr.set_pre_routing_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!req.has_header("Transfer-Encoding")) return httplib::Server::HandlerResponse::Unhandled;
    reply(res, 411,
          error_body(
              "expected a request body with a Content-Length (at most " + std::to_string(kMaxBody) +
                  " bytes), got Transfer-Encoding: " + req.get_header_value("Transfer-Encoding"),
              json("body")));
    res.set_header("Connection", "close");
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request&, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = "HTTP status " + std::to_string(res.status);
        if (res.status == 400) message = "a malformed HTTP request";
        if (res.status == 404) message = "not found";
        if (res.status == 414) message = "the request's URI is too long";
        if (res.status == 413) {
          message = "the request body is larger than " + std::to_string(kMaxBody) + " bytes";
        }
        reply(res, res.status, error_body(message, res.status == 413 ? json("body") : json()));
        return httplib::Server::HandlerResponse::Handled;
      }));

  // ---- static files: the fixed, embedded set -------------------------------------------------
  const auto& assets = embedded_assets();
  const std::string default_lang = options.lang;
  auto page = [&assets, default_lang](const httplib::Request& req, httplib::Response& res) {
    std::string lang = req.get_param_value("lang");
    if (lang != "en" && lang != "zh") lang = default_lang;
    std::string html(assets.at("index.html"));
    for (std::size_t at; (at = html.find("%LANG%")) != std::string::npos;) {
      html.replace(at, 6, lang);
    }
    res.set_header("Cache-Control", "no-store");
    res.set_content(html, "text/html; charset=utf-8");
  };
  svr.Get("/", page);
  svr.Get("/index.html", page);
  for (const char* name : {"app.js", "style.css", "chart.min.js"}) {
    const std::string_view body = assets.at(name);
    const char* mime = mime_of(name);
    svr.Get(std::string("/") + name, [body, mime](const httplib::Request&, httplib::Response& res) {
      res.set_content(body.data(), body.size(), mime);
    });
  }

  // ---- the API ------------------------------------------------------------------------------
  svr.Get("/api/info", [](const httplib::Request&, httplib::Response& res) {
    guarded(res, [] { return parameter_info(); });
  });
  auto compute = [&compute_gate](json (*fn)(const json&)) {
    return [&compute_gate, fn](const httplib::Request& req, httplib::Response& res) {
      guarded(res, [&] {
        const json body = parse_body(req);
        std::lock_guard lock(compute_gate);
        return fn(body);
      });
    };
  };
  svr.Post("/api/scores", compute(compute_scores));
  svr.Post("/api/freeze", compute(compute_freeze));
  svr.Post("/api/softmax", [](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] { return compute_softmax(parse_body(req)); });
  });
  svr.Post("/api/train/start", [&trainer](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const TrainSpec spec = read_train_spec(parse_body(req));
      return json{{"id", trainer.start(client_of(req), spec)->id()}};
    });
  });
  svr.Post("/api/train/stop", [&trainer](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      const json body = parse_body(req);
      if (!body.is_object()) throw ParamError("body", "the request body must be a JSON object");
      for (const auto& [key, value] : body.items()) {
        if (key != "id") throw ParamError(key, "unknown parameter \"" + key + "\"");
      }
      const std::int64_t id = run_id(body.value("id", json()), "id");
      auto run = trainer.find(id);
      if (!run || run->client() != client_of(req)) {
        throw ParamError("id", "id: no training run " + std::to_string(id) + " of this client");
      }
      run->request_stop();
      return json{{"id", id}, {"stopping", true}};
    });
  });
  svr.Get("/api/train/run", [&trainer](const httplib::Request& req, httplib::Response& res) {
    guarded(res, [&] {
      auto run = trainer.find(query_id(req));
      if (!run) throw ParamError("id", "id: no training run " + req.get_param_value("id"));
      return run->snapshot();
    });
  });
  // Server-sent events: "point" events with one evaluation each, then one "end" event with the
  // final state. Each call of the provider waits at most 250 ms, so a stopping server (httplib
  // checks between calls) or a vanished client ends the stream promptly.
  const int max_streams = options.max_streams;
  svr.Get("/api/train/events",
          [&trainer, &streams, max_streams](const httplib::Request& req, httplib::Response& res) {
            std::shared_ptr<TrainRun> run;
            guarded(res, [&] {
              run = trainer.find(query_id(req));
              if (!run) throw ParamError("id", "id: no training run " + req.get_param_value("id"));
              if (streams.fetch_add(1) >= max_streams) {
                streams.fetch_sub(1);
                run = nullptr;
                throw Busy("too many event streams are open");
              }
              return json::object();
            });
            if (!run) return;
            auto seen = std::make_shared<std::size_t>(0);
            res.body.clear();  // reply() set Cache-Control: no-store already
            res.set_chunked_content_provider(
                "text/event-stream",
                [run, seen](std::size_t, httplib::DataSink& sink) {
                  std::vector<TrainPoint> fresh;
                  const TrainRun::State state = run->wait(*seen, 250, fresh);
                  std::string text;
                  for (const TrainPoint& p : fresh)
                    text += "event: point\ndata: " + to_json(p).dump() + "\n\n";
                  *seen += fresh.size();
                  if (state != TrainRun::State::running) {
                    json end = {{"state", TrainRun::state_name(state)}, {"points", *seen}};
                    text += "event: end\ndata: " + end.dump() + "\n\n";
                  } else if (text.empty()) {
                    text = ": waiting\n\n";  // a comment: finds a closed connection within 250 ms
                  }
                  if (!sink.write(text.data(), text.size())) return false;
                  if (state != TrainRun::State::running) sink.done();
                  return true;
                },
                [&streams](bool) { streams.fetch_sub(1); });
          });

  const int port = options.port == 0
                       ? svr.bind_to_any_port(options.host)
                       : (svr.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port < 0) {
    restore_signals();
    throw sdpa::Error("--host/--port: cannot listen on " + options.host + ":" +
                      std::to_string(options.port) +
                      " (in use, or not an address of this machine)");
  }

  // httplib listens with a backlog of 5: a burst of connections beyond it (a page opens six at
  // once, the load test 200) would be refused or reset. Listening again raises the backlog.
  if (listen_fd >= 0) ::listen(listen_fd, kBacklog);

  std::atomic<bool> listen_done{false};
  std::thread watcher([&svr, &listen_done] {
    while (!g_stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // A stop() before the accept loop has started is ignored by httplib: wait for the loop.
    while (!listen_done) {
      if (svr.is_running()) {
        svr.stop();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  on_listening(port);
  svr.listen_after_bind();
  listen_done = true;
  g_stop_requested = true;
  watcher.join();
  trainer.shutdown();
  restore_signals();
}

}  // namespace sdpa::serve
