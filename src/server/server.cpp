#include "swarmkv/server.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <sys/socket.h>

#include <nlohmann/json.hpp>

#include "server/completion_engine.h"
#include "server/http_server.h"
#include "server/openai.h"
#include "server/pipeline_runner.h"
#include "server/request_guard.h"
#include "swarmkv/chat.h"
#include "swarmkv/error.h"
#include "swarmkv/log.h"
#include "swarmkv/measure.h"
#include "swarmkv/run_page.h"

namespace swarmkv {
namespace {

using nlohmann::json;
using server::Event;

// Seconds the requests failed at the drain deadline get to write their
// error and return before the listener closes.
constexpr double kFailedRequestsReturn = 5;

std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// The name every server answers to besides its model id (README's examples
// use it), listed by /v1/models.
constexpr std::string_view kModelAlias = "swarmkv";

// The end of every event stream.
constexpr std::string_view kStreamDone = "data: [DONE]\n\n";

// The routes a metric names: a request's own path would make one series
// per path a client invents (and carry its bytes into the exposition).
constexpr std::array<std::string_view, 6> kRoutes = {
    "/health", "/v1/models", "/metrics", "/v1/chat/completions", "/v1/pipelines", "/"};
std::string_view route_of(const std::string& path) {
  for (const std::string_view r : kRoutes) {
    if (path == r) return r;
  }
  if (path.starts_with("/runs/")) return "/runs/{id}";
  if (path.starts_with("/v1/pipelines/")) return "/v1/pipelines/{id}";
  return "other";
}

// The pages a browser opens (it sends Basic auth, never a Bearer header).
bool is_page(const std::string& path) {
  return path == "/" || path.starts_with("/runs/");
}

// Seconds between reloads of a page whose run goes on.
constexpr int kPageRefreshS = 1;

bool starts_with_ci(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() &&
         std::equal(prefix.begin(), prefix.end(), text.begin(), [](char a, char b) {
           return a == std::tolower(static_cast<unsigned char>(b));
         });
}

// The key an Authorization header carries: "Bearer <key>", or "Basic
// base64(<any user>:<key>)" (what a browser sends once asked); "" for
// anything else. Scheme names are case-insensitive (RFC 9110 11.1).
std::string given_key(std::string_view header) {
  constexpr std::string_view kBearer = "bearer ", kBasic = "basic ";
  if (starts_with_ci(header, kBearer)) return std::string(header.substr(kBearer.size()));
  if (!starts_with_ci(header, kBasic)) return "";
  std::string_view b64 = header.substr(kBasic.size());
  while (!b64.empty() && b64.front() == ' ') b64.remove_prefix(1);
  if (b64.empty() || b64.size() % 4 != 0 || b64.size() > 4096) return "";
  std::string plain(b64.size() / 4 * 3, '\0');
  const int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(plain.data()),
                                reinterpret_cast<const unsigned char*>(b64.data()),
                                static_cast<int>(b64.size()));
  if (n < 0) return "";
  const size_t padding = b64.ends_with("==") ? 2 : b64.ends_with("=") ? 1 : 0;
  plain.resize(static_cast<size_t>(n) - padding);
  const size_t colon = plain.find(':');
  return colon == std::string::npos ? "" : plain.substr(colon + 1);
}

// A Prometheus label value: backslash, double quote and line feed escaped.
std::string label_value(std::string_view v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// One request as its handler thread sees it, for the access log line: the
// pre-routing handler starts it, a completion adds its token counts, the
// logger writes and ends it (httplib runs all three, and a stream's
// writer, on the request's thread).
struct RequestTrace {
  std::optional<Clock::time_point> start;
  std::optional<server::Usage> usage;
};
thread_local RequestTrace trace;

// A Prometheus histogram with fixed buckets, in seconds. Thread-safe.
class Histogram {
 public:
  void observe(double s) {
    std::lock_guard lock(mutex_);
    for (size_t i = 0; i < kBounds.size(); ++i) {
      if (s <= kBounds[i]) ++counts_[i];
    }
    ++count_;
    sum_ += s;
  }
  void write(std::string& out, std::string_view name, std::string_view help) const {
    std::lock_guard lock(mutex_);
    out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
    for (size_t i = 0; i < kBounds.size(); ++i) {
      out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, kBounds[i], counts_[i]);
    }
    out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name,
                       sum_, name, count_);
  }

 private:
  static constexpr std::array<double, 12> kBounds = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,    2.5,   5,    10,  30,   60};
  mutable std::mutex mutex_;
  std::array<uint64_t, kBounds.size()> counts_{};  // guarded by mutex_
  uint64_t count_ = 0;                             // guarded by mutex_
  double sum_ = 0;                                 // guarded by mutex_
};

// Counts a request in flight for as long as it lives.
class InFlight {
 public:
  explicit InFlight(std::atomic<int32_t>& n) : n_(&n) { ++*n_; }
  ~InFlight() { --*n_; }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<int32_t>* n_;
};

}  // namespace

struct Server::Impl {
  std::shared_ptr<const Model> model;
  ServerOptions options;
  server::RequestLimits limits;
  server::PipelineLimits pipeline_limits;
  std::string model_id;

  // A request may name the model as /v1/models lists it, or not at all.
  bool serves(const std::string& name) const {
    return name.empty() || name == model_id || name == kModelAlias;
  }
  std::unique_ptr<server::CompletionEngine> engine;
  std::unique_ptr<server::PipelineRunner> pipelines;
  server::HttpServer http;
  std::optional<server::RequestGuard> request_guard;  // set by the constructor
  int port = 0;
  int listen_fd = -1;  // the listening socket, as set_socket_options saw it
  std::atomic<int32_t> in_flight{0};
  std::atomic<bool> draining{false};
  std::atomic<uint64_t> next_id{1};
  std::mutex stop_mutex;
  std::thread drain_thread;  // guarded by stop_mutex; joined by ~Impl
  // Metrics: {status -> count} per route, guarded by metrics_mutex.
  std::mutex metrics_mutex;
  std::map<std::pair<std::string, int>, uint64_t> responses;
  Histogram ttft;
  Histogram duration;

  void count(const httplib::Request& req, int status) {
    const std::string_view route = route_of(req.path);
    {
      std::lock_guard lock(metrics_mutex);
      ++responses[{std::string(route), status}];
    }
    const double ms = trace.start ? ms_between(*trace.start, Clock::now()) : 0;
    std::string tokens;
    if (trace.usage) {
      tokens = fmt::format(" prompt_tokens {} cached_tokens {} completion_tokens {}",
                           trace.usage->prompt_tokens, trace.usage->cached_tokens,
                           trace.usage->completion_tokens);
    }
    log_info("http {} {} {} {:.1f} ms{}", req.method, route, status, ms, tokens);
    trace = {};
  }

  // `as` overrides the ErrorCode's mapping for the HTTP layer's own
  // refusals (401, 413, 429).
  void send_error(httplib::Response& res, const ErrorValue& e,
                  std::optional<server::HttpError> as = std::nullopt) {
    const server::HttpError h = as.value_or(server::http_error(e.code));
    res.status = h.status;
    res.set_content(dump(server::error_body(e, h)), "application/json");
  }

  void send_too_large(httplib::Response& res) {
    send_error(res,
               {ErrorCode::kInvalidArgument,
                fmt::format("body: larger than {} bytes, the most this server takes",
                            options.max_body_bytes)},
               {{413, "invalid_request_error", ""}});
  }

  bool authorised(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    const std::string given = given_key(req.get_header_value("Authorization"));
    // Equal-length digests compared in constant time: neither the key's
    // length nor its bytes leak through timing.
    unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
    SHA256(reinterpret_cast<const unsigned char*>(given.data()), given.size(), a);
    SHA256(reinterpret_cast<const unsigned char*>(options.api_key.data()), options.api_key.size(),
           b);
    return !given.empty() && CRYPTO_memcmp(a, b, sizeof a) == 0;
  }

  std::string metrics() {
    const server::EngineStats s = engine->stats();
    std::string out;
    const auto metric = [&](std::string_view name, std::string_view type, std::string_view help,
                            double value) {
      out +=
          fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };
    const BuildInfo build = build_info();
    out += fmt::format(
        "# HELP swarmkv_build_info The build serving: SwarmKV's version, the llama.cpp commit "
        "and the hash of our patches to it.\n"
        "# TYPE swarmkv_build_info gauge\n"
        "swarmkv_build_info{{version=\"{}\",llama_commit=\"{}\",llama_patches=\"{}\"}} 1\n",
        label_value(build.version), label_value(build.llama_commit),
        label_value(build.llama_patches));
    {
      std::lock_guard lock(metrics_mutex);
      out +=
          "# HELP swarmkv_http_responses_total HTTP responses by route (other: no such route) "
          "and status.\n"
          "# TYPE swarmkv_http_responses_total counter\n";
      for (const auto& [key, n] : responses) {
        out += fmt::format("swarmkv_http_responses_total{{route=\"{}\",status=\"{}\"}} {}\n",
                           label_value(key.first), key.second, n);
      }
    }
    metric("swarmkv_http_connections_open", "gauge", "HTTP connections open.",
           http.open_connections());
    metric("swarmkv_http_connections_refused_total", "counter",
           "HTTP connections answered 503 and closed: over --max-connections.",
           static_cast<double>(http.refused_over_limit()));
    metric("swarmkv_http_head_timeouts_total", "counter",
           "HTTP requests whose line and headers took longer than --header-timeout (408).",
           static_cast<double>(http.timed_out_heads()));
    metric("swarmkv_requests_total", "counter", "Completion requests admitted to the engine.",
           static_cast<double>(s.requests));
    metric("swarmkv_prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           static_cast<double>(s.prompt_tokens));
    metric("swarmkv_prefilled_tokens_total", "counter", "Prompt tokens decoded (not forked).",
           static_cast<double>(s.prefilled_tokens));
    metric("swarmkv_reused_tokens_total", "counter",
           "Prompt tokens forked from a sequence in the KV cache instead of prefilled.",
           static_cast<double>(s.reused_tokens));
    metric("swarmkv_restored_tokens_total", "counter",
           "Prompt tokens restored from the snapshot store (part of the reused ones).",
           static_cast<double>(s.restored_tokens));
    metric("swarmkv_completion_tokens_total", "counter", "Tokens generated.",
           static_cast<double>(s.completion_tokens));
    metric("swarmkv_cancelled_total", "counter",
           "Requests whose client went away before the answer was complete.",
           static_cast<double>(s.cancelled));
    metric("swarmkv_decode_steps_total", "counter", "llama_decode calls.",
           static_cast<double>(s.decode_steps));
    metric("swarmkv_kv_resets_total", "counter",
           "Exact mode: times the KV cache started over once its cells were all handed out.",
           static_cast<double>(s.kv_resets));
    metric("swarmkv_live_sequences", "gauge", "Completions waiting, prefilling or generating.",
           s.live_sequences);
    metric("swarmkv_cached_sequences", "gauge", "Finished sequences kept for prefix reuse.",
           s.cached_sequences);
    metric("swarmkv_kv_cells_used", "gauge", "KV cells held by any sequence.", s.kv_cells_used);
    metric("swarmkv_kv_cells_capacity", "gauge", "KV cells of the shared context.",
           s.kv_cells_total);
    metric("swarmkv_queue_length", "gauge", "Requests waiting for room in the engine.", s.queued);
    metric("swarmkv_requests_in_flight", "gauge",
           "HTTP completion and pipeline requests being answered.", in_flight.load());
    const server::PipelineStats p = pipelines->stats();
    metric("swarmkv_pipelines_total", "counter", "Pipeline runs accepted.",
           static_cast<double>(p.runs));
    metric("swarmkv_pipelines_cancelled_total", "counter",
           "Pipeline runs whose client went away (or the server stopped) before they ended.",
           static_cast<double>(p.cancelled));
    metric("swarmkv_pipelines_running", "gauge", "Pipeline runs accepted and not ended.",
           p.running);
    ttft.write(out, "swarmkv_time_to_first_token_seconds",
               "From a request's arrival to its first answer text.");
    duration.write(out, "swarmkv_request_duration_seconds",
                   "From a completion request's arrival to its last byte.");
    return out;
  }

  json response_json(const std::string& id, const std::vector<std::string>& texts,
                     const std::vector<StopReason>& reasons, const server::Usage& usage) const {
    json choices = json::array();
    for (size_t i = 0; i < texts.size(); ++i) {
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", texts[i]}}},
                         {"logprobs", nullptr},
                         {"finish_reason", server::finish_reason(reasons[i])}});
    }
    return {{"id", id},
            {"object", "chat.completion"},
            {"created", static_cast<int64_t>(std::time(nullptr))},
            {"model", model_id},
            {"system_fingerprint", engine_id()},
            {"choices", choices},
            {"usage", usage_json(usage)}};
  }

  static json usage_json(const server::Usage& u) {
    return {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"total_tokens", u.prompt_tokens + u.completion_tokens},
            {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
  }

  json chunk_json(const std::string& id, int64_t created, json choices) const {
    return {
        {"id", id},          {"object", "chat.completion.chunk"}, {"created", created},
        {"model", model_id}, {"system_fingerprint", engine_id()}, {"choices", std::move(choices)}};
  }

  // The run with this id, or nullptr after answering 404.
  std::shared_ptr<const server::PipelineJob> find_run(const std::string& id,
                                                      httplib::Response& res) {
    auto job = pipelines->find(id);
    if (!job) {
      send_error(res,
                 {ErrorCode::kNotFound,
                  fmt::format("no run '{}' here: this server keeps its last {} pipeline runs "
                              "(--keep-runs), and GET / lists them",
                              id, options.keep_runs)},
                 {{404, "invalid_request_error", ""}});
    }
    return job;
  }

  // Answers 503 while draining and 429 over max_concurrent; otherwise
  // returns the request's place in flight.
  std::shared_ptr<InFlight> admit(httplib::Response& res);
  void chat(const httplib::Request& req, const std::string& body, httplib::Response& res);
  void pipeline(const httplib::Request& req, const std::string& body, httplib::Response& res);
  // Answers 403 and returns true for a request whose Host or Origin the
  // guard refuses.
  bool refused_by_guard(const httplib::Request& req, httplib::Response& res);
  // Registers a POST route whose body must be JSON (Content-Type
  // application/json, else 415): a page on another site can send a form or
  // text/plain to any server without asking first, never JSON. The body is
  // read here: httplib would parse a form-encoded one itself and refuse one
  // over 8 KiB with 413.
  void post_json(const std::string& route,
                 void (Impl::*handle)(const httplib::Request& req, const std::string& body,
                                      httplib::Response& res));
};

void Server::Impl::post_json(const std::string& route,
                             void (Impl::*handle)(const httplib::Request& req,
                                                  const std::string& body,
                                                  httplib::Response& res)) {
  http.Post(route, [this, handle](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& read) {
    if (const std::string type = req.get_header_value("Content-Type");
        !server::is_json_content_type(type)) {
      send_error(res,
                 {ErrorCode::kInvalidArgument,
                  fmt::format("body: {}; send the request as one JSON object with the header "
                              "'Content-Type: application/json'",
                              type.empty() ? std::string("no Content-Type")
                                           : fmt::format("Content-Type '{}'", type))},
                 {{415, "invalid_request_error", "unsupported_media_type"}});
      return;
    }
    std::string body;
    const bool whole = read([&body](const char* data, size_t n) {
      body.append(data, n);
      return true;
    });
    if (!whole) {
      if (res.status == 413) {
        send_too_large(res);
      } else {
        send_error(res, {ErrorCode::kInvalidArgument, "body: the request ended before its body"},
                   {{400, "invalid_request_error", ""}});
      }
      return;
    }
    (this->*handle)(req, body, res);
  });
}

bool Server::Impl::refused_by_guard(const httplib::Request& req, httplib::Response& res) {
  const std::optional<server::Refusal> refusal = request_guard->check(
      req.get_header_value("Host"), req.get_header_value("Origin"), req.local_addr);
  if (!refusal) return false;
  send_error(res, {ErrorCode::kInvalidArgument, refusal->message},
             {{403, "invalid_request_error", refusal->code}});
  return true;
}

std::shared_ptr<InFlight> Server::Impl::admit(httplib::Response& res) {
  if (draining.load()) {
    send_error(res, {ErrorCode::kAborted, "the server is shutting down"},
               {{503, "server_error", ""}});
    return nullptr;
  }
  auto guard = std::make_shared<InFlight>(in_flight);
  if (in_flight.load() > options.max_concurrent) {
    res.set_header("Retry-After", "1");
    send_error(res,
               {ErrorCode::kBudget,
                fmt::format("{} requests are in flight, the most this server takes (--max-"
                            "concurrent); retry later",
                            options.max_concurrent)},
               {{429, "rate_limit_error", "rate_limit_exceeded"}});
    return nullptr;
  }
  return guard;
}

void Server::Impl::chat(const httplib::Request&, const std::string& body, httplib::Response& res) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto since = [t0] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  auto guard = admit(res);
  if (!guard) return;
  std::shared_ptr<server::Job> job;
  server::ChatRequest chat;
  try {
    chat = server::parse_chat_request(body, limits);
    if (!serves(chat.model)) {
      send_error(res,
                 {ErrorCode::kNotFound,
                  fmt::format("model '{}' is not served here: this server serves '{}' (also "
                              "called '{}'); GET /v1/models lists them",
                              chat.model, model_id, kModelAlias)},
                 {{404, "invalid_request_error", "model_not_found"}});
      return;
    }
    server::CompletionRequest c;
    c.prompt = chat_tokens(*model, chat.messages);
    c.sampling = chat.sampling;
    c.stop = chat.stop;
    c.n = chat.n;
    c.max_tokens = chat.max_tokens > 0 ? chat.max_tokens : options.default_max_tokens;
    if (chat.max_tokens == 0) {
      // No max_tokens: whatever the context leaves, up to the default.
      const int64_t room = static_cast<int64_t>(engine->options().context.n_ctx) -
                           static_cast<int64_t>(c.prompt.size());
      c.max_tokens = static_cast<int32_t>(std::clamp<int64_t>(room, 1, c.max_tokens));
    }
    job = engine->submit(std::move(c));
  } catch (const Error& e) {
    send_error(res, e.value());
    return;
  }
  const std::string id = fmt::format("chatcmpl-swarmkv-{}", next_id.fetch_add(1));

  if (!chat.stream) {
    std::vector<std::string> texts(static_cast<size_t>(chat.n));
    std::vector<StopReason> reasons(static_cast<size_t>(chat.n), StopReason::kMaxTokens);
    bool first = true;
    for (;;) {
      const std::optional<Event> e = job->next(std::chrono::milliseconds(500));
      if (!e) continue;
      if (e->kind == Event::Kind::kDelta) {
        if (first) ttft.observe(since());
        first = false;
        texts[static_cast<size_t>(e->choice)] += e->text;
      } else if (e->kind == Event::Kind::kChoiceDone) {
        reasons[static_cast<size_t>(e->choice)] = e->stop_reason;
      } else if (e->kind == Event::Kind::kFinished) {
        res.set_content(dump(response_json(id, texts, reasons, e->usage)), "application/json");
        trace.usage = e->usage;
        duration.observe(since());
        return;
      } else {
        send_error(res, e->error);
        return;
      }
    }
  }

  // Streaming: one chunk per event, then [DONE]. A write that fails means
  // the client went away: the job is cancelled and its sequences freed.
  struct Stream {
    std::shared_ptr<server::Job> job;
    std::shared_ptr<InFlight> guard;
    bool started = false;
    bool first_text = true;
    bool finished = false;
  };
  auto st = std::make_shared<Stream>(Stream{job, guard});
  const int64_t created = static_cast<int64_t>(std::time(nullptr));
  const int32_t n = chat.n;
  const bool include_usage = chat.include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, id, created, n, include_usage, since](size_t, httplib::DataSink& sink) {
        const auto send = [&](const json& j) {
          const std::string line = "data: " + dump(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        if (!st->started) {
          st->started = true;
          json choices = json::array();
          for (int32_t i = 0; i < n; ++i) {
            choices.push_back({{"index", i},
                               {"delta", {{"role", "assistant"}, {"content", ""}}},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr}});
          }
          if (!send(chunk_json(id, created, choices))) {
            st->job->cancel();
            return false;
          }
        }
        const std::optional<Event> e = st->job->next(std::chrono::milliseconds(200));
        if (!e) {
          if (sink.is_writable()) return true;
          st->job->cancel();
          return false;
        }
        bool ok = true;
        switch (e->kind) {
          case Event::Kind::kDelta:
            if (st->first_text) ttft.observe(since());
            st->first_text = false;
            ok = send(chunk_json(id, created,
                                 json::array({{{"index", e->choice},
                                               {"delta", {{"content", e->text}}},
                                               {"logprobs", nullptr},
                                               {"finish_reason", nullptr}}})));
            break;
          case Event::Kind::kChoiceDone:
            ok = send(chunk_json(
                id, created,
                json::array({{{"index", e->choice},
                              {"delta", json::object()},
                              {"logprobs", nullptr},
                              {"finish_reason", server::finish_reason(e->stop_reason)}}})));
            break;
          case Event::Kind::kFinished: {
            if (include_usage) {
              json last = chunk_json(id, created, json::array());
              last["usage"] = usage_json(e->usage);
              ok = send(last);
            }
            ok = ok && sink.write(kStreamDone.data(), kStreamDone.size());
            trace.usage = e->usage;
            st->finished = true;
            duration.observe(since());
            if (ok) sink.done();
            break;
          }
          case Event::Kind::kFailed: {
            ok = send(server::error_body(e->error, server::http_error(e->error.code))) &&
                 sink.write(kStreamDone.data(), kStreamDone.size());
            st->finished = true;
            if (ok) sink.done();
            break;
          }
        }
        if (!ok) st->job->cancel();
        return ok;
      },
      [st](bool) {
        if (!st->finished) st->job->cancel();
      });
}

void Server::Impl::pipeline(const httplib::Request& req, const std::string& body,
                            httplib::Response& res) {
  auto guard = admit(res);
  if (!guard) return;
  std::shared_ptr<server::PipelineJob> job;
  try {
    job = pipelines->submit(server::parse_pipeline_request(body, pipeline_limits), pipeline_limits);
  } catch (const Error& e) {
    send_error(res, e.value());
    return;
  }
  if (!job) {
    res.set_header("Retry-After", "1");
    send_error(
        res,
        {ErrorCode::kBudget,
         fmt::format("{} pipeline{} running, the most this server runs at once "
                     "(--max-pipelines); retry later",
                     pipelines->max_running(), pipelines->max_running() == 1 ? " is" : "s are")},
        {{429, "rate_limit_error", "rate_limit_exceeded"}});
    return;
  }
  res.set_header("X-SwarmKV-Run-Id", job->id());
  log_info("serve: pipeline run {} accepted: its page is /runs/{}", job->id(), job->id());

  if (req.get_param_value("stream") == "false") {
    for (;;) {
      const std::optional<server::PipelineEvent> e = job->next(std::chrono::milliseconds(500));
      if (!e) continue;
      if (e->name == "result") {
        res.set_content(dump(e->data), "application/json");
        return;
      }
      if (e->name == "error") {
        send_error(res, *e->error);
        return;
      }
    }
  }

  // Server-sent events until "result" (or "error"). A write that fails
  // means the client went away: the run is cancelled.
  struct Stream {
    std::shared_ptr<server::PipelineJob> job;
    std::shared_ptr<InFlight> guard;
    bool finished = false;
  };
  auto st = std::make_shared<Stream>(Stream{job, guard});
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t, httplib::DataSink& sink) {
        const std::optional<server::PipelineEvent> e =
            st->job->next(std::chrono::milliseconds(200));
        if (!e) {
          if (sink.is_writable()) return true;
          st->job->cancel("the client went away");
          return false;
        }
        const std::string text = fmt::format("event: {}\ndata: {}\n\n", e->name, dump(e->data));
        bool ok = sink.write(text.data(), text.size());
        if (e->name == "result" || e->name == "error") {
          st->finished = true;
          if (ok) sink.done();
        }
        if (!ok) st->job->cancel("the client went away");
        return ok;
      },
      [st](bool) {
        if (!st->finished) st->job->cancel("the client went away");
      });
}

Server::Server(std::shared_ptr<const Model> model, ServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.model = std::move(model);
  s.options = std::move(options);
  const ServerOptions& o = s.options;
  if (o.max_concurrent < 1 || o.max_messages < 1 || o.max_tokens < 1 || o.default_max_tokens < 1 ||
      o.max_n < 1 || o.max_body_bytes < 1 || !(o.drain_s >= 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need max_concurrent, max_messages, max_tokens, default_max_tokens, "
                            "max_n, max_body_bytes >= 1 and drain_s >= 0 (got {}, {}, {}, {}, "
                            "{}, {}, {})",
                            o.max_concurrent, o.max_messages, o.max_tokens, o.default_max_tokens,
                            o.max_n, o.max_body_bytes, o.drain_s));
  }
  if (o.max_connections < 1 || !(o.header_timeout_s > 0) || !(o.request_timeout_s > 0)) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need max_connections >= 1, header_timeout_s and request_timeout_s "
                            "> 0 (got {}, {}, {})",
                            o.max_connections, o.header_timeout_s, o.request_timeout_s));
  }
  if (o.max_pipelines < 0 || o.max_pipeline_agents < 1 || o.max_pipeline_ctx < 1 ||
      o.keep_runs < 1) {
    throw Error(
        ErrorCode::kInvalidArgument,
        fmt::format("need max_pipelines >= 0, max_pipeline_agents, max_pipeline_ctx and "
                    "keep_runs >= 1 (got {}, {}, {}, {})",
                    o.max_pipelines, o.max_pipeline_agents, o.max_pipeline_ctx, o.keep_runs));
  }
  s.request_guard.emplace(o.host, o.allow_hosts, o.allow_origins);
  s.pipeline_limits = {.max_agents = o.max_pipeline_agents,
                       .max_tokens = o.max_tokens,
                       .max_n_ctx = o.max_pipeline_ctx,
                       .exact = o.exact};
  s.limits = {.max_messages = o.max_messages,
              .max_tokens = o.max_tokens,
              .max_n = std::min(o.max_n, o.max_live)};
  s.model_id = o.model_name.empty() ? std::filesystem::path(s.model->path()).filename().string()
                                    : o.model_name;
  s.engine = std::make_unique<server::CompletionEngine>(
      s.model,
      server::EngineOptions{.context = o.context,
                            .max_live = o.max_live,
                            .max_cached = o.max_cached,
                            .snapshot_dir = o.snapshots.cache == SnapshotCacheMode::kOff
                                                ? std::string()
                                                : snapshot_store_dir(o.snapshots.cache_dir),
                            .exact = o.exact});
  // Posted pipelines run on the threads the shared context runs with.
  s.pipeline_limits.n_threads = s.engine->options().context.n_threads;
  s.pipeline_limits.n_threads_batch = s.engine->options().context.n_threads_batch;
  s.pipelines =
      std::make_unique<server::PipelineRunner>(s.model, o.max_pipelines, o.snapshots, o.keep_runs);

  // Each connection holds a thread of its own, up to max_connections.
  s.http.set_connection_limits({.max_connections = o.max_connections,
                                .header_timeout_s = o.header_timeout_s,
                                .request_timeout_s = o.request_timeout_s},
                               [](int status, const std::string& message) {
                                 const bool timed_out = status == 408;
                                 return dump(server::error_body(
                                     {timed_out ? ErrorCode::kIo : ErrorCode::kAborted, message},
                                     {status, timed_out ? "invalid_request_error" : "server_error",
                                      timed_out ? "request_timeout" : "too_many_connections"}));
                               });
  s.http.set_payload_max_length(o.max_body_bytes);
  s.http.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    trace = {.start = Clock::now(), .usage = std::nullopt};
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (s.refused_by_guard(req, res)) return httplib::Server::HandlerResponse::Handled;
    if (s.authorised(req)) return httplib::Server::HandlerResponse::Unhandled;
    // A browser asks its user for the key when told Basic; an API client
    // is told Bearer.
    const bool page = is_page(req.path);
    res.set_header("WWW-Authenticate", page ? R"(Basic realm="swarmkv", charset="UTF-8")"
                                            : R"(Bearer realm="swarmkv")");
    s.send_error(res,
                 {ErrorCode::kInvalidArgument,
                  page ? "missing or wrong API key: give any user name and the key as the password "
                         "(or send the header 'Authorization: Bearer <key>')"
                       : "missing or wrong API key: send the header 'Authorization: Bearer <key>'"},
                 {{401, "invalid_request_error", "invalid_api_key"}});
    return httplib::Server::HandlerResponse::Handled;
  });
  s.http.set_error_handler([&s](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error JSON
    if (res.status == 413) {
      s.send_too_large(res);
    } else if (res.status == 404) {
      s.send_error(res, {ErrorCode::kNotFound, fmt::format("no route {} {}", req.method, req.path)},
                   {{404, "invalid_request_error", ""}});
    } else {
      s.send_error(res, {ErrorCode::kInvalidArgument, fmt::format("HTTP {}", res.status)},
                   {{res.status, "invalid_request_error", ""}});
    }
  });
  s.http.set_exception_handler(
      [&s](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::rethrow_exception(ep);
        } catch (...) {
          s.send_error(res, current_error_value(), {{500, "server_error", ""}});
        }
      });
  s.http.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
    s.count(req, res.status);
  });
  s.http.Get("/health", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"status", s.draining.load() ? "draining" : "ok"}}), "application/json");
    if (s.draining.load()) res.status = 503;
  });
  s.http.Get("/v1/models", [&s](const httplib::Request&, httplib::Response& res) {
    const auto entry = [](std::string_view id) {
      return json{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "swarmkv"}};
    };
    json data = json::array({entry(s.model_id)});
    if (s.model_id != kModelAlias) data.push_back(entry(kModelAlias));
    res.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
  });
  s.http.Get("/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    res.set_content(s.metrics(), "text/plain; version=0.0.4");
  });
  s.post_json("/v1/chat/completions", &Impl::chat);
  if (o.max_pipelines > 0) {
    s.post_json("/v1/pipelines", &Impl::pipeline);
    s.http.Get("/", [&s](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(
          runs_index_html(s.pipelines->recent(), s.model_id + " — swarmkv serve", kPageRefreshS),
          "text/html; charset=utf-8");
    });
    s.http.Get(R"(/runs/([^/]+))", [&s](const httplib::Request& req, httplib::Response& res) {
      const auto job = s.find_run(req.matches[1], res);
      if (!job) return;
      const json view = job->view();
      const std::string state = view["live"]["state"];
      res.set_header("Cache-Control", "no-store");
      res.set_content(run_page_html(view, fmt::format("run {} on this server", job->id()),
                                    state == "queued" || state == "running" ? kPageRefreshS : 0),
                      "text/html; charset=utf-8");
    });
    s.http.Get(R"(/v1/pipelines/([^/]+))",
               [&s](const httplib::Request& req, httplib::Response& res) {
                 const auto job = s.find_run(req.matches[1], res);
                 if (job) res.set_content(dump(job->view()), "application/json");
               });
  }

  if (o.port < 0 || o.port > 65535) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("port must be in [0, 65535] (got {})", o.port));
  }
  // This httplib listens with a backlog of 5: a burst of agents connecting
  // at once (or before the accept loop runs) would overflow it and stall
  // or fail connections. The socket is kept here to listen again with the
  // system's most.
  s.http.set_socket_options([&s](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    s.listen_fd = sock;
  });
  if (o.port == 0) {
    s.port = s.http.bind_to_any_port(o.host);
    if (s.port < 0) s.port = 0;
  } else if (s.http.bind_to_port(o.host, o.port)) {
    s.port = o.port;
  }
  if (s.port <= 0) {
    throw Error(
        ErrorCode::kIo,
        fmt::format("cannot listen on {}:{} (in use, or no such local address)", o.host, o.port));
  }
  if (s.listen_fd >= 0) ::listen(s.listen_fd, SOMAXCONN);
}

Server::~Server() {
  stop();
  std::lock_guard lock(impl_->stop_mutex);
  if (impl_->drain_thread.joinable()) impl_->drain_thread.join();
  impl_->pipelines->shutdown("the server is shutting down");
  impl_->engine->shutdown();
}

int Server::port() const noexcept {
  return impl_->port;
}

void Server::run() {
  if (impl_->draining.load()) return;
  log_info("serve: listening on http://{}:{} ({} KV cells, {} live completions)",
           impl_->options.host, impl_->port, impl_->engine->options().context.n_ctx,
           impl_->options.max_live);
  impl_->http.listen_after_bind();
}

void Server::stop() {
  Impl& s = *impl_;
  std::lock_guard lock(s.stop_mutex);
  if (s.draining.exchange(true)) return;
  // The listener stays up while requests in flight finish: /health answers
  // 503 "draining" and new work 503 (admit). Only then does httplib stop,
  // since it ends every chunked stream as soon as its listener closes.
  s.drain_thread = std::thread([&s] {
    const auto wait_idle = [&s](double seconds) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
      while (s.in_flight.load() > 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    };
    wait_idle(s.options.drain_s);
    // What is left fails with kAborted: a stream gets its error event and
    // [DONE], an answer its error; both return to httplib within a step.
    s.pipelines->shutdown("the server is shutting down");
    s.engine->shutdown();
    wait_idle(kFailedRequestsReturn);
    s.http.stop();
  });
}

}  // namespace swarmkv
