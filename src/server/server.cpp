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
#include <random>
#include <string_view>
#include <thread>
#include <unordered_map>

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
constexpr std::array<std::string_view, 7> kRoutes = {
    "/health",         "/v1/models",    "/metrics", "/v1/chat/completions",
    "/v1/completions", "/v1/pipelines", "/"};
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

// Requests in flight per client address.
class ClientCounts {
 public:
  // The client's count with this request.
  int32_t add(const std::string& client) {
    std::lock_guard lock(mutex_);
    return ++counts_[client];
  }
  void remove(const std::string& client) {
    std::lock_guard lock(mutex_);
    const auto it = counts_.find(client);
    if (it != counts_.end() && --it->second <= 0) counts_.erase(it);
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, int32_t> counts_;
};

// Counts a request in flight, in all and for its client, for as long as it
// lives.
class InFlight {
 public:
  InFlight(std::atomic<int32_t>& n, ClientCounts& per_client, std::string client)
      : n_(&n), per_client_(&per_client), client_(std::move(client)) {
    ++*n_;
    from_client_ = per_client_->add(client_);
  }
  ~InFlight() {
    --*n_;
    per_client_->remove(client_);
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  int32_t from_client() const { return from_client_; }

 private:
  std::atomic<int32_t>* n_;
  ClientCounts* per_client_;
  std::string client_;
  int32_t from_client_ = 0;
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
  ClientCounts in_flight_per_client;
  int32_t per_client_concurrent = 1;  // options' max_concurrent_per_client, resolved
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

  // The Prometheus exposition of GET /metrics.
  std::string metrics() {
    std::string out;
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
    const auto metric = [&out](std::string_view name, std::string_view type, std::string_view help,
                               double value) {
      out +=
          fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, value);
    };
    metric("swarmkv_http_connections_open", "gauge", "HTTP connections open.",
           http.open_connections());
    metric("swarmkv_http_connections_refused_total", "counter",
           "HTTP connections answered 503 and closed: over --max-connections.",
           static_cast<double>(http.refused_over_limit()));
    metric("swarmkv_http_connections_refused_per_client_total", "counter",
           "HTTP connections answered 503 and closed: over their address's share "
           "(--max-connections-per-client).",
           static_cast<double>(http.refused_per_client()));
    metric("swarmkv_http_head_timeouts_total", "counter",
           "HTTP requests whose line and headers took longer than --header-timeout (408).",
           static_cast<double>(http.timed_out_heads()));
    engine_metrics(metric);
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

  // The completion engine's counters and gauges, through `metric`.
  template <class Metric>
  void engine_metrics(const Metric& metric) const {
    const server::EngineStats s = engine->stats();
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
  }

  // A choice's message: its text, or with tools its call (a call cut by
  // max_tokens stays text, finish_reason "length"; under tool_choice "auto"
  // an answer that chose text is that text).
  static json message_json(const std::string& id, int32_t choice, const std::string& text,
                           StopReason reason, bool calls_tool) {
    if (!calls_tool || reason == StopReason::kMaxTokens) {
      return {{"role", "assistant"}, {"content", text}};
    }
    if (const std::optional<std::string> response = response_of(text)) {
      return {{"role", "assistant"}, {"content", *response}};
    }
    return {{"role", "assistant"},
            {"content", nullptr},
            {"tool_calls", tool_calls_of(text, call_id(id, choice))}};
  }
  static std::string call_id(const std::string& id, int32_t choice) {
    return fmt::format("call-{}-{}", id, choice);
  }
  static std::string_view finish_reason(StopReason reason, bool calls_tool,
                                        const std::string& text) {
    return calls_tool && reason != StopReason::kMaxTokens && !response_of(text)
               ? "tool_calls"
               : server::finish_reason(reason);
  }

  json response_json(const std::string& id, const server::ChatRequest& request,
                     const std::vector<std::string>& texts, const std::vector<StopReason>& reasons,
                     const std::vector<json>& logprobs, const server::Usage& usage) const {
    const bool text = request.endpoint == server::Endpoint::kCompletions;
    const bool calls_tool = !request.tools.empty();
    json choices = json::array();
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto choice = static_cast<int32_t>(i);
      json c = {{"index", i}};
      if (text) {
        c["text"] = request.echo ? request.prompts.at(i / static_cast<size_t>(request.n)) + texts[i]
                                 : texts[i];
      } else {
        c["message"] = message_json(id, choice, texts[i], reasons[i], calls_tool);
      }
      c["logprobs"] = logprobs[i];
      c["finish_reason"] = finish_reason(reasons[i], calls_tool, texts[i]);
      choices.push_back(std::move(c));
    }
    return {{"id", id},
            {"object", text ? "text_completion" : "chat.completion"},
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

  json chunk_json(const std::string& id, int64_t created, json choices,
                  server::Endpoint endpoint = server::Endpoint::kChat) const {
    return {{"id", id},
            {"object", endpoint == server::Endpoint::kCompletions ? "text_completion"
                                                                  : "chat.completion.chunk"},
            {"created", created},
            {"model", model_id},
            {"system_fingerprint", engine_id()},
            {"choices", std::move(choices)}};
  }

  // A choice's log probabilities as its endpoint shows them: chat's
  // "content" list, or the completions endpoint's tokens, token_logprobs,
  // top_logprobs and text_offset (counted from the prompt's start).
  // With echo, the prompt's tokens first (`prompt_scores`: its tokens
  // after the first).
  json choice_logprobs(const server::ChatRequest& request, int32_t choice,
                       std::span<const SampledLogprobs> tokens,
                       std::span<const SampledLogprobs> prompt_scores) const {
    if (request.endpoint == server::Endpoint::kChat) return server::logprobs_json(tokens);
    const auto p = static_cast<size_t>(choice / request.n);
    const std::string& prompt = request.prompts.at(p);
    const bool top = request.sampling.top_logprobs > 0;
    if (request.echoed.empty()) return server::completion_logprobs_json(tokens, prompt.size(), top);
    const server::ChatRequest::EchoedPrompt& echoed = request.echoed.at(p);
    server::PromptLogprobs listed;
    if (echoed.added == 0) listed.unscored = echoed.first_text;
    const size_t from = std::min(echoed.added == 0 ? 0 : echoed.added - 1, prompt_scores.size());
    listed.scored = prompt_scores.subspan(from);
    return server::completion_logprobs_json(tokens, prompt.size(), top, &listed);
  }
  // What an echoed prompt's logprobs need of its tokens: how many the
  // tokenizer put before the text (BOS; its own tokens are those of the
  // text alone when they end the prompt), and the first text token's text.
  server::ChatRequest::EchoedPrompt echoed_prompt(const std::vector<Token>& prompt,
                                                  const std::string& text) const {
    const std::vector<Token> own =
        model->tokenize(text, /*add_special=*/false, /*parse_special=*/true);
    server::ChatRequest::EchoedPrompt e;
    if (own.size() <= prompt.size() &&
        std::equal(own.begin(), own.end(),
                   prompt.end() - static_cast<std::ptrdiff_t>(own.size()))) {
      e.added = prompt.size() - own.size();
    }
    if (e.added == 0) e.first_text = model->token_to_piece(prompt.front(), /*special=*/true);
    return e;
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
  std::shared_ptr<InFlight> admit(const httplib::Request& req, httplib::Response& res);
  // POST /v1/chat/completions and /v1/completions: one path, the request's
  // and the answer's shapes chosen by the endpoint.
  void chat(const httplib::Request& req, const std::string& body, httplib::Response& res) {
    complete(req, body, res, server::Endpoint::kChat);
  }
  void text_completion(const httplib::Request& req, const std::string& body,
                       httplib::Response& res) {
    complete(req, body, res, server::Endpoint::kCompletions);
  }
  void complete(const httplib::Request& req, const std::string& body, httplib::Response& res,
                server::Endpoint endpoint);
  // Parses a request of `endpoint` into `chat` and submits it to the
  // engine; nullptr after answering the error.
  std::shared_ptr<server::Job> submit_chat(const std::string& body, server::Endpoint endpoint,
                                           server::ChatRequest& chat, httplib::Response& res);
  // Answers a chat completion as one JSON body once it is complete.
  void answer_whole(server::Job& job, const server::ChatRequest& chat, const std::string& id,
                    Clock::time_point t0, httplib::Response& res);
  class ChatStream;
  // The constructor's steps: the request limits, the completion engine
  // and the pipeline runner; httplib's handlers; the routes; the listening
  // socket (throws Error(kInvalidArgument) for a port out of range,
  // Error(kIo) when it cannot listen).
  void start_engines();
  void set_http_handlers();
  void add_routes();
  void bind();
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

std::shared_ptr<InFlight> Server::Impl::admit(const httplib::Request& req, httplib::Response& res) {
  if (draining.load()) {
    send_error(res, {ErrorCode::kAborted, "the server is shutting down"},
               {{503, "server_error", ""}});
    return nullptr;
  }
  auto guard = std::make_shared<InFlight>(in_flight, in_flight_per_client, req.remote_addr);
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
  if (guard->from_client() > per_client_concurrent) {
    res.set_header("Retry-After", "1");
    send_error(res,
               {ErrorCode::kBudget,
                fmt::format("{} requests from {} are in flight, the most one client may have "
                            "(--max-concurrent-per-client); retry later",
                            per_client_concurrent, req.remote_addr)},
               {{429, "rate_limit_error", "rate_limit_exceeded"}});
    return nullptr;
  }
  return guard;
}

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The status a request whose client hung up is counted under in the
// metrics (nginx's; nobody reads the response).
constexpr int kClientClosedRequest = 499;

// Whether the client of the request this thread answers has hung up,
// looked at no more often than every 200 ms (a poll of its socket).
class ClientWatch {
 public:
  bool gone() {
    const auto now = Clock::now();
    if (now - last_ < std::chrono::milliseconds(200)) return false;
    last_ = now;
    return server::HttpServer::client_gone();
  }

 private:
  Clock::time_point last_ = Clock::now();
};

}  // namespace

std::shared_ptr<server::Job> Server::Impl::submit_chat(const std::string& body,
                                                       server::Endpoint endpoint,
                                                       server::ChatRequest& chat,
                                                       httplib::Response& res) {
  try {
    chat = endpoint == server::Endpoint::kChat ? server::parse_chat_request(body, limits)
                                               : server::parse_completion_request(body, limits);
    if (!serves(chat.model)) {
      send_error(res,
                 {ErrorCode::kNotFound,
                  fmt::format("model '{}' is not served here: this server serves '{}' (also "
                              "called '{}'); GET /v1/models lists them",
                              chat.model, model_id, kModelAlias)},
                 {{404, "invalid_request_error", "model_not_found"}});
      return nullptr;
    }
    // Without "seed" each request samples from a seed of its own, as
    // OpenAI's do; the one used goes back in a header, so that a sampled
    // answer can be had again.
    if (!chat.seed_given) chat.sampling.seed = std::random_device{}();
    // A text completion continues its prompt as written: control-token
    // texts in it are those tokens (a client may write a template's markup
    // itself), as llama-server reads them. Several prompts are one job's
    // parts, each with n choices.
    std::vector<std::vector<Token>> prompts;
    if (endpoint == server::Endpoint::kChat) {
      prompts.push_back(chat_tokens(*model, chat.messages));
    } else {
      for (const std::string& text : chat.prompts) {
        prompts.push_back(model->tokenize(text, /*add_special=*/true, /*parse_special=*/true));
        if (chat.echo && chat.sampling.top_logprobs >= 0) {
          chat.echoed.push_back(echoed_prompt(prompts.back(), text));
        }
      }
      // Token ids are decoded as given; their text (control tokens
      // rendered) is what echo repeats and offsets count in.
      for (size_t p = 0; p < chat.prompt_tokens.size(); ++p) {
        std::vector<Token>& tokens = chat.prompt_tokens[p];
        for (size_t i = 0; i < tokens.size(); ++i) {
          if (tokens[i] >= model->n_vocab()) {
            throw Error(
                ErrorCode::kInvalidArgument,
                fmt::format("prompt: token {} (prompt {}, position {}) is not in the model's "
                            "vocabulary (ids 0 to {})",
                            tokens[i], p, i, model->n_vocab() - 1));
          }
        }
        chat.prompts.push_back(model->detokenize(tokens, /*special=*/true));
        if (chat.echo && chat.sampling.top_logprobs >= 0) {
          chat.echoed.push_back(
              {.added = 0, .first_text = model->token_to_piece(tokens.front(), true)});
        }
        prompts.push_back(std::move(tokens));
      }
      chat.prompt_tokens.clear();
    }
    std::vector<server::CompletionRequest> parts;
    for (std::vector<Token>& prompt : prompts) {
      server::CompletionRequest c;
      c.prompt = std::move(prompt);
      c.sampling = chat.sampling;
      c.stop = chat.stop;
      c.n = chat.n;
      if (!chat.echoed.empty()) c.prompt_logprobs = chat.sampling.top_logprobs;
      c.max_tokens = chat.max_tokens > 0 ? chat.max_tokens : options.default_max_tokens;
      if (chat.prompt_only) {
        c.max_tokens = 0;
      } else if (chat.max_tokens == 0) {
        // No max_tokens: whatever the context leaves, up to the default.
        const int64_t room = static_cast<int64_t>(engine->options().context.n_ctx) -
                             static_cast<int64_t>(c.prompt.size());
        c.max_tokens = static_cast<int32_t>(std::clamp<int64_t>(room, 1, c.max_tokens));
      }
      parts.push_back(std::move(c));
    }
    auto job = engine->submit(std::move(parts));
    res.set_header("X-SwarmKV-Seed", std::to_string(chat.sampling.seed));
    return job;
  } catch (const Error& e) {
    send_error(res, e.value());
    return nullptr;
  }
}

void Server::Impl::answer_whole(server::Job& job, const server::ChatRequest& chat,
                                const std::string& id, Clock::time_point t0,
                                httplib::Response& res) {
  const int32_t n = chat.choices();
  std::vector<std::string> texts(static_cast<size_t>(n));
  std::vector<StopReason> reasons(static_cast<size_t>(n), StopReason::kMaxTokens);
  std::vector<json> logprobs(static_cast<size_t>(n));
  bool first = true;
  // Nothing is written before the answer is whole: a client that hangs up
  // meanwhile is seen on its socket, and its job cancelled.
  ClientWatch watch;
  for (;;) {
    const std::optional<Event> e = job.next(std::chrono::milliseconds(200));
    if (watch.gone()) {
      job.cancel();
      res.status = kClientClosedRequest;
      return;
    }
    if (!e) continue;
    if (e->kind == Event::Kind::kDelta) {
      if (first) ttft.observe(seconds_since(t0));
      first = false;
      texts[static_cast<size_t>(e->choice)] += e->text;
    } else if (e->kind == Event::Kind::kChoiceDone) {
      reasons[static_cast<size_t>(e->choice)] = e->stop_reason;
      if (chat.sampling.top_logprobs >= 0) {
        logprobs[static_cast<size_t>(e->choice)] =
            choice_logprobs(chat, e->choice, e->logprobs, e->prompt_logprobs);
      }
    } else if (e->kind == Event::Kind::kFinished) {
      try {
        res.set_content(dump(response_json(id, chat, texts, reasons, logprobs, e->usage)),
                        "application/json");
      } catch (const Error& error) {
        send_error(res, error.value());
        return;
      }
      trace.usage = e->usage;
      duration.observe(seconds_since(t0));
      return;
    } else {
      send_error(res, e->error);
      return;
    }
  }
}

// A streamed chat completion: one chunk per engine event, then [DONE]. A
// write that fails means the client went away: the job is cancelled and its
// sequences freed. Thread-confined to the request's thread (httplib calls
// its provider there).
class Server::Impl::ChatStream {
 public:
  ChatStream(Impl& server, std::shared_ptr<server::Job> job, std::shared_ptr<InFlight> guard,
             const server::ChatRequest& chat, std::string id, Clock::time_point t0)
      : server_(server),
        job_(std::move(job)),
        guard_(std::move(guard)),
        request_(chat),
        id_(std::move(id)),
        n_(chat.choices()),
        include_usage_(chat.include_usage),
        calls_tool_(!chat.tools.empty()),
        logprobs_(chat.sampling.top_logprobs >= 0),
        t0_(t0),
        calls_(calls_tool_ ? static_cast<size_t>(chat.n) : 0) {}

  // The content provider's call: the next chunk, or false to end.
  bool step(httplib::DataSink& sink) {
    if (!started_) {
      started_ = true;
      if (!text_ && !send(sink, roles())) return cancel();
      if (text_ && request_.echo && !send_prompts(sink)) return cancel();
    }
    const std::optional<Event> e = job_->next(std::chrono::milliseconds(200));
    if (!e) return sink.is_writable() || cancel();
    return send_event(sink, *e) || cancel();
  }
  // The provider's release: a stream that did not finish is cancelled.
  void release() {
    if (!finished_) job_->cancel();
  }

 private:
  bool cancel() {
    job_->cancel();
    return false;
  }
  bool send(httplib::DataSink& sink, const json& j) {
    const std::string line = "data: " + dump(j) + "\n\n";
    return sink.write(line.data(), line.size());
  }
  bool send_done(httplib::DataSink& sink) {
    return sink.write(kStreamDone.data(), kStreamDone.size());
  }
  // Echo: each choice's first chunk is its prompt (its logprobs go out with
  // the answer's, in the last).
  bool send_prompts(httplib::DataSink& sink) {
    for (int32_t i = 0; i < n_; ++i) {
      const std::string& prompt = request_.prompts.at(static_cast<size_t>(i / request_.n));
      if (!send(sink, choice_chunk(i, {{"content", prompt}}, nullptr))) return false;
    }
    return true;
  }
  // The first chunk: every choice's role.
  json roles() const {
    json choices = json::array();
    for (int32_t i = 0; i < n_; ++i) {
      choices.push_back(
          {{"index", i},
           {"delta", {{"role", "assistant"}, {"content", calls_tool_ ? json() : json("")}}},
           {"logprobs", nullptr},
           {"finish_reason", nullptr}});
    }
    return server_.chunk_json(id_, created_, choices);
  }
  // A choice's chunk: chat's delta, or a text completion's "text" (the
  // delta's content).
  json choice_chunk(int32_t choice, json delta, json finish_reason, json logprobs = nullptr) const {
    json c = {{"index", choice}};
    if (text_) {
      c["text"] = delta.value("content", "");
    } else {
      c["delta"] = std::move(delta);
    }
    c["logprobs"] = std::move(logprobs);
    c["finish_reason"] = std::move(finish_reason);
    return server_.chunk_json(id_, created_, json::array({std::move(c)}), request_.endpoint);
  }
  bool send_event(httplib::DataSink& sink, const Event& e) {
    switch (e.kind) {
      case Event::Kind::kDelta:
        if (first_text_) server_.ttft.observe(seconds_since(t0_));
        first_text_ = false;
        if (calls_tool_) {  // a call goes out whole once complete
          calls_[static_cast<size_t>(e.choice)] += e.text;
          return true;
        }
        return send(sink, choice_chunk(e.choice, {{"content", e.text}}, nullptr));
      case Event::Kind::kChoiceDone:
        if (calls_tool_ && !send_call(sink, e)) return false;
        // A choice's log probabilities go out with its last chunk.
        return send(sink,
                    choice_chunk(e.choice, json::object(),
                                 finish_reason(e.stop_reason, calls_tool_,
                                               calls_tool_ ? calls_[static_cast<size_t>(e.choice)]
                                                           : std::string()),
                                 logprobs_ ? server_.choice_logprobs(request_, e.choice, e.logprobs,
                                                                     e.prompt_logprobs)
                                           : json()));
      case Event::Kind::kFinished: {
        bool ok = true;
        if (include_usage_) {
          json last = server_.chunk_json(id_, created_, json::array(), request_.endpoint);
          last["usage"] = usage_json(e.usage);
          ok = send(sink, last);
        }
        ok = ok && send_done(sink);
        trace.usage = e.usage;
        finished_ = true;
        server_.duration.observe(seconds_since(t0_));
        if (ok) sink.done();
        return ok;
      }
      case Event::Kind::kFailed: {
        const bool ok = send(sink, server::error_body(e.error, server::http_error(e.error.code))) &&
                        send_done(sink);
        finished_ = true;
        if (ok) sink.done();
        return ok;
      }
    }
    return true;
  }

  // A choice's tool call as one delta (or, cut by max_tokens or chosen
  // under "auto", its text).
  bool send_call(httplib::DataSink& sink, const Event& e) {
    const std::string& text = calls_[static_cast<size_t>(e.choice)];
    json delta;
    try {
      delta = message_json(id_, e.choice, text, e.stop_reason, true);
    } catch (const Error& error) {  // not a call: said, and the stream ends
      send(sink, server::error_body(error.value(), server::http_error(error.code())));
      return false;
    }
    delta.erase("role");
    if (delta.contains("tool_calls")) {
      for (size_t i = 0; i < delta["tool_calls"].size(); ++i) delta["tool_calls"][i]["index"] = i;
    }
    return send(sink, choice_chunk(e.choice, std::move(delta), nullptr));
  }

  Impl& server_;
  std::shared_ptr<server::Job> job_;
  std::shared_ptr<InFlight> guard_;  // the request counts in flight while it streams
  const server::ChatRequest request_;
  const bool text_ = request_.endpoint == server::Endpoint::kCompletions;
  const std::string id_;
  const int64_t created_ = static_cast<int64_t>(std::time(nullptr));
  const int32_t n_;
  const bool include_usage_;
  const bool calls_tool_;  // the answers are tool calls (or, under "auto", text), sent whole
  const bool logprobs_;    // "logprobs": true
  const Clock::time_point t0_;
  std::vector<std::string> calls_;  // with tools: each choice's text so far
  bool started_ = false;
  bool first_text_ = true;
  bool finished_ = false;
};

void Server::Impl::complete(const httplib::Request& req, const std::string& body,
                            httplib::Response& res, server::Endpoint endpoint) {
  const Clock::time_point t0 = Clock::now();
  auto guard = admit(req, res);
  if (!guard) return;
  server::ChatRequest chat;
  std::shared_ptr<server::Job> job = submit_chat(body, endpoint, chat, res);
  if (!job) return;
  const std::string id =
      fmt::format("{}-swarmkv-{}", endpoint == server::Endpoint::kChat ? "chatcmpl" : "cmpl",
                  next_id.fetch_add(1));
  if (!chat.stream) return answer_whole(*job, chat, id, t0, res);
  auto st = std::make_shared<ChatStream>(*this, std::move(job), std::move(guard), chat, id, t0);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream", [st](size_t, httplib::DataSink& sink) { return st->step(sink); },
      [st](bool) { st->release(); });
}

void Server::Impl::pipeline(const httplib::Request& req, const std::string& body,
                            httplib::Response& res) {
  auto guard = admit(req, res);
  if (!guard) return;
  std::shared_ptr<server::PipelineJob> job;
  try {
    server::PostedRun posted = server::parse_posted_run(body, pipeline_limits);
    job = std::visit([&](auto& run) { return pipelines->submit(std::move(run), pipeline_limits); },
                     posted);
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
    // As a whole chat answer: a client that hangs up cancels its run.
    ClientWatch watch;
    for (;;) {
      const std::optional<server::PipelineEvent> e = job->next(std::chrono::milliseconds(200));
      if (watch.gone()) {
        job->cancel("the client went away");
        res.status = kClientClosedRequest;
        return;
      }
      if (!e) continue;
      if (e->kind == server::PipelineEvent::Kind::kResult) {
        res.set_content(dump(e->data), "application/json");
        return;
      }
      if (e->kind == server::PipelineEvent::Kind::kError) {
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
        const std::string text =
            fmt::format("event: {}\ndata: {}\n\n", to_string(e->kind), dump(e->data));
        bool ok = sink.write(text.data(), text.size());
        if (e->last()) {
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

namespace {

// Posted pipelines' store: a folder of the operator's store, with a cap of
// its own.
constexpr uint64_t kDefaultPostedCacheMax = uint64_t{1} << 30;
SnapshotOptions posted_store(const ServerOptions& o) {
  SnapshotOptions posted = o.snapshots;
  posted.cache_dir =
      (std::filesystem::path(snapshot_store_dir(o.snapshots.cache_dir)) / "posted").string();
  posted.cache_max_bytes =
      o.posted_cache_max_bytes > 0 ? o.posted_cache_max_bytes : kDefaultPostedCacheMax;
  return posted;
}

// One client's share of `total`: `given`, or total / `divisor` when 0
// (at least 1, at most total).
int32_t per_client_share(int32_t given, int32_t total, int32_t divisor) {
  return std::clamp(given > 0 ? given : total / divisor, 1, total);
}

// Throws Error(kInvalidArgument) naming the options out of range.
void check_options(const ServerOptions& o) {
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
  if (o.max_connections_per_client < 0 || o.max_concurrent_per_client < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need max_connections_per_client and max_concurrent_per_client >= 0 "
                            "(0: a share of the total; got {}, {})",
                            o.max_connections_per_client, o.max_concurrent_per_client));
  }
  if (o.max_pipelines < 0 || o.max_pipeline_agents < 1 || o.max_pipeline_documents < 1 ||
      o.max_pipeline_ctx < 1 || o.keep_runs < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("need max_pipelines >= 0, max_pipeline_agents, max_pipeline_documents, "
                            "max_pipeline_ctx and keep_runs >= 1 (got {}, {}, {}, {}, {})",
                            o.max_pipelines, o.max_pipeline_agents, o.max_pipeline_documents,
                            o.max_pipeline_ctx, o.keep_runs));
  }
}

}  // namespace

void Server::Impl::start_engines() {
  const ServerOptions& o = options;
  request_guard.emplace(o.host, o.allow_hosts, o.allow_origins);
  pipeline_limits = {.max_agents = o.max_pipeline_agents,
                     .max_documents = o.max_pipeline_documents,
                     .max_tokens = o.max_tokens,
                     .max_n_ctx = o.max_pipeline_ctx,
                     .exact = o.exact};
  limits = {.max_messages = o.max_messages,
            .max_tokens = o.max_tokens,
            .max_n = std::min(o.max_n, o.max_live)};
  model_id = o.model_name.empty() ? std::filesystem::path(model->path()).filename().string()
                                  : o.model_name;
  engine = std::make_unique<server::CompletionEngine>(
      model, server::EngineOptions{.context = o.context,
                                   .max_live = o.max_live,
                                   .max_cached = o.max_cached,
                                   .snapshot_dir = o.snapshots.cache == SnapshotCacheMode::kOff
                                                       ? std::string()
                                                       : snapshot_store_dir(o.snapshots.cache_dir),
                                   .exact = o.exact});
  // Posted pipelines run on the threads the shared context runs with.
  pipeline_limits.n_threads = engine->options().context.n_threads;
  pipeline_limits.n_threads_batch = engine->options().context.n_threads_batch;
  pipelines = std::make_unique<server::PipelineRunner>(model, o.max_pipelines, posted_store(o),
                                                       o.keep_runs);
}

void Server::Impl::set_http_handlers() {
  const ServerOptions& o = options;
  // Each connection holds a thread of its own, up to max_connections.
  per_client_concurrent = per_client_share(o.max_concurrent_per_client, o.max_concurrent, 2);
  http.set_connection_limits({.max_connections = o.max_connections,
                              .max_connections_per_client = per_client_share(
                                  o.max_connections_per_client, o.max_connections, 4),
                              .header_timeout_s = o.header_timeout_s,
                              .request_timeout_s = o.request_timeout_s},
                             [](int status, const std::string& message) {
                               const bool timed_out = status == 408;
                               return dump(server::error_body(
                                   {timed_out ? ErrorCode::kIo : ErrorCode::kAborted, message},
                                   {status, timed_out ? "invalid_request_error" : "server_error",
                                    timed_out ? "request_timeout" : "too_many_connections"}));
                             });
  http.set_payload_max_length(o.max_body_bytes);
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    trace = {.start = Clock::now(), .usage = std::nullopt};
    if (req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    if (refused_by_guard(req, res)) return httplib::Server::HandlerResponse::Handled;
    if (authorised(req)) return httplib::Server::HandlerResponse::Unhandled;
    // A browser asks its user for the key when told Basic; an API client
    // is told Bearer.
    const bool page = is_page(req.path);
    res.set_header("WWW-Authenticate", page ? R"(Basic realm="swarmkv", charset="UTF-8")"
                                            : R"(Bearer realm="swarmkv")");
    send_error(res,
               {ErrorCode::kInvalidArgument,
                page ? "missing or wrong API key: give any user name and the key as the password "
                       "(or send the header 'Authorization: Bearer <key>')"
                     : "missing or wrong API key: send the header 'Authorization: Bearer <key>'"},
               {{401, "invalid_request_error", "invalid_api_key"}});
    return httplib::Server::HandlerResponse::Handled;
  });
  http.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own error JSON
    if (res.status == 413) {
      send_too_large(res);
    } else if (res.status == 404) {
      send_error(res, {ErrorCode::kNotFound, fmt::format("no route {} {}", req.method, req.path)},
                 {{404, "invalid_request_error", ""}});
    } else {
      send_error(res, {ErrorCode::kInvalidArgument, fmt::format("HTTP {}", res.status)},
                 {{res.status, "invalid_request_error", ""}});
    }
  });
  http.set_exception_handler(
      [this](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::rethrow_exception(ep);
        } catch (...) {
          send_error(res, current_error_value(), {{500, "server_error", ""}});
        }
      });
  http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    count(req, res.status);
  });
}

void Server::Impl::add_routes() {
  const ServerOptions& o = options;
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(dump({{"status", draining.load() ? "draining" : "ok"}}), "application/json");
    if (draining.load()) res.status = 503;
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const auto entry = [](std::string_view id) {
      return json{{"id", id}, {"object", "model"}, {"created", 0}, {"owned_by", "swarmkv"}};
    };
    json data = json::array({entry(model_id)});
    if (model_id != kModelAlias) data.push_back(entry(kModelAlias));
    res.set_content(dump({{"object", "list"}, {"data", data}}), "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics(), "text/plain; version=0.0.4");
  });
  post_json("/v1/chat/completions", &Impl::chat);
  post_json("/v1/completions", &Impl::text_completion);
  if (o.max_pipelines > 0) {
    post_json("/v1/pipelines", &Impl::pipeline);
    http.Get("/", [this](const httplib::Request&, httplib::Response& res) {
      res.set_header("Cache-Control", "no-store");
      res.set_content(
          runs_index_html(pipelines->recent(), model_id + " — swarmkv serve", kPageRefreshS),
          "text/html; charset=utf-8");
    });
    http.Get(R"(/runs/([^/]+))", [this](const httplib::Request& req, httplib::Response& res) {
      const auto job = find_run(req.matches[1], res);
      if (!job) return;
      // The state before the view: a run that ends between the two reloads once more.
      const bool going = job->going();
      res.set_header("Cache-Control", "no-store");
      const nlohmann::json view = job->view();
      const std::string source = fmt::format("run {} on this server", job->id());
      const int refresh_s = going ? kPageRefreshS : 0;
      res.set_content(view.value("kind", "") == "corpus" ? corpus_page_html(view, source, refresh_s)
                                                         : run_page_html(view, source, refresh_s),
                      "text/html; charset=utf-8");
    });
    http.Get(R"(/v1/pipelines/([^/]+))",
             [this](const httplib::Request& req, httplib::Response& res) {
               const auto job = find_run(req.matches[1], res);
               if (job) res.set_content(dump(job->view()), "application/json");
             });
  }
}

void Server::Impl::bind() {
  const ServerOptions& o = options;
  if (o.port < 0 || o.port > 65535) {
    throw Error(ErrorCode::kInvalidArgument,
                fmt::format("port must be in [0, 65535] (got {})", o.port));
  }
  // This httplib listens with a backlog of 5: a burst of agents connecting
  // at once (or before the accept loop runs) would overflow it and stall
  // or fail connections. The socket is kept here to listen again with the
  // system's most.
  http.set_socket_options([this](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = sock;
  });
  if (o.port == 0) {
    port = http.bind_to_any_port(o.host);
    if (port < 0) port = 0;
  } else if (http.bind_to_port(o.host, o.port)) {
    port = o.port;
  }
  if (port <= 0) {
    throw Error(
        ErrorCode::kIo,
        fmt::format("cannot listen on {}:{} (in use, or no such local address)", o.host, o.port));
  }
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
}

Server::Server(std::shared_ptr<const Model> model, ServerOptions options)
    : impl_(std::make_unique<Impl>()) {
  check_options(options);
  impl_->model = std::move(model);
  impl_->options = std::move(options);
  impl_->start_engines();
  impl_->set_http_handlers();
  impl_->add_routes();
  impl_->bind();
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
  // The GET routes keep answering (a run that ends during the drain can
  // still be read), each answer closing its connection.
  s.http.close_after_each_request();
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
