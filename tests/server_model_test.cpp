// `swarmkv serve` over real HTTP on loopback with a real model: answers
// against a fresh re-prefill, the prefix prefilled once for concurrent
// agents, OpenAI's shapes (streaming too), posted pipelines against the same
// run in process, every refusal's status, a client that goes away, the
// drain, and a bounded load.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <unistd.h>
#include <csignal>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include "greedy_reference.h"
#include "swarmkv/corpus.h"
#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/paths.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "swarmkv/server.h"
#include "test_models.h"

namespace swarmkv {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

std::string document(size_t n_chars, const std::string& file = "apache-2.0.txt") {
  return read_file(std::string(SWARMKV_SOURCE_DIR) + "/examples/documents/" + file)
      .substr(0, n_chars);
}

// A server on a free loopback port, serving on its own thread until the
// test ends.
class Running {
 public:
  Running(std::shared_ptr<const Model> model, ServerOptions options) {
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return
    options.host = "127.0.0.1";
    options.port = 0;
    server_ = std::make_unique<Server>(std::move(model), options);
    thread_ = std::thread([this] { server_->run(); });
  }
  ~Running() { stop(); }
  Running(const Running&) = delete;
  Running& operator=(const Running&) = delete;

  int port() const { return server_->port(); }
  Server& server() { return *server_; }
  void stop() {
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  std::unique_ptr<httplib::Client> client(const std::string& key = "") const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port());
    c->set_read_timeout(600, 0);
    if (!key.empty()) c->set_bearer_token_auth(key.c_str());
    return c;
  }

 private:
  std::unique_ptr<Server> server_;
  std::thread thread_;
};

// One metric's value from /metrics (-1 when absent).
double metric(httplib::Client& c, const std::string& name) {
  const auto res = c.Get("/metrics");
  if (!res || res->status != 200) return -1;
  const std::string& body = res->body;
  for (size_t at = 0; (at = body.find(name + " ", at)) != std::string::npos; ++at) {
    if (at == 0 || body[at - 1] == '\n') return std::stod(body.substr(at + name.size() + 1));
  }
  return -1;
}

// Polls until metric `name` equals `value` (bounded: 20 s).
// A run id: 32 lower-case hex digits (128 random bits). No <regex>: under
// ASan GCC 12 warns inside libstdc++'s regex, and warnings are errors.
bool is_run_id(const std::string& id) {
  return id.size() == 32 && id.find_first_not_of("0123456789abcdef") == std::string::npos;
}

bool await_metric(httplib::Client& c, const std::string& name, double value) {
  for (int i = 0; i < 400; ++i) {
    if (metric(c, name) == value) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

// POST /v1/chat/completions whose response body goes to `receive` as it
// arrives (return false to hang up); this httplib's Post has no receiver.
// `on_head`, when set, sees the response's status and headers first.
httplib::Result post_receiving(httplib::Client& c, const json& body,
                               std::function<bool(const char*, size_t)> receive,
                               const std::string& path = "/v1/chat/completions",
                               httplib::ResponseHandler on_head = {}) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.response_handler = std::move(on_head);
  req.content_receiver = [receive](const char* data, size_t len, uint64_t, uint64_t) {
    return receive(data, len);
  };
  return c.send(req);
}

json chat_body(const std::string& system, const std::string& user, int max_tokens) {
  json messages = json::array();
  if (!system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
  messages.push_back({{"role", "user"}, {"content", user}});
  return {{"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

// A non-streamed answer's JSON; fails the test on another status.
json post_chat(httplib::Client& c, const json& body,
               const std::string& path = "/v1/chat/completions") {
  const auto res = c.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(res) << "no response";
  if (!res) return {};
  EXPECT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  return json::parse(res->body);
}

// The shapes a strict OpenAI client reads from a completion.
void expect_completion_shape(const json& j, int n) {
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_TRUE(j["id"].is_string());
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_TRUE(j["model"].is_string());
  ASSERT_TRUE(j["choices"].is_array());
  ASSERT_EQ(j["choices"].size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const json& c = j["choices"][static_cast<size_t>(i)];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["message"]["role"], "assistant");
    EXPECT_TRUE(c["message"]["content"].is_string());
    EXPECT_TRUE(c["finish_reason"] == "stop" || c["finish_reason"] == "length");
  }
  const json& u = j["usage"];
  EXPECT_EQ(u["total_tokens"].get<int>(),
            u["prompt_tokens"].get<int>() + u["completion_tokens"].get<int>());
  EXPECT_TRUE(u["prompt_tokens_details"]["cached_tokens"].is_number_integer());
}

// A streamed answer: the text of each choice, the finish reasons, the
// usage chunk, after checking every chunk's shape and the [DONE] end.
struct Streamed {
  std::vector<std::string> texts;
  std::vector<std::string> finish;
  std::vector<json> tool_calls;  // each choice's, as the deltas sent them
  std::vector<json> logprobs;    // each choice's logprobs.content, the chunks' together
  json usage;
  int status = 0;
};
// A streamed chat completion, or (path /v1/completions) text completion,
// its chunks gathered per choice.
Streamed post_stream(httplib::Client& c, json body, int n = 1,
                     const std::string& path = "/v1/chat/completions") {
  const bool text = path == "/v1/completions";
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  Streamed out;
  out.texts.resize(static_cast<size_t>(n));
  out.finish.resize(static_cast<size_t>(n));
  out.tool_calls.resize(static_cast<size_t>(n), json::array());
  out.logprobs.resize(static_cast<size_t>(n), json::array());
  std::string buffer;
  bool done = false;
  const auto res = post_receiving(
      c, body,
      [&](const char* data, size_t len) {
        buffer.append(data, len);
        for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
          const std::string event = buffer.substr(0, end);
          buffer.erase(0, end + 2);
          EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
          EXPECT_FALSE(done) << "an event after [DONE]";
          const std::string payload = event.substr(6);
          if (payload == "[DONE]") {
            done = true;
            continue;
          }
          const json chunk = json::parse(payload);
          EXPECT_EQ(chunk["object"], text ? "text_completion" : "chat.completion.chunk") << payload;
          if (chunk.contains("usage")) {
            EXPECT_TRUE(chunk["choices"].empty());
            out.usage = chunk["usage"];
            continue;
          }
          for (const json& choice : chunk["choices"]) {
            const auto i = choice["index"].get<size_t>();
            // A text completion's chunk carries its text where chat's has a delta.
            const json delta = text ? json{{"content", choice["text"]}} : choice["delta"];
            if (delta.contains("content") && !delta["content"].is_null()) {
              out.texts[i] += delta["content"].get<std::string>();
            }
            if (!choice["logprobs"].is_null()) {
              if (text) {
                out.logprobs[i] = choice["logprobs"];  // whole, with the choice's last chunk
              } else {
                for (const json& t : choice["logprobs"]["content"]) out.logprobs[i].push_back(t);
              }
            }
            if (delta.contains("tool_calls")) {
              for (const json& call : delta["tool_calls"]) out.tool_calls[i].push_back(call);
            }
            if (!choice["finish_reason"].is_null()) out.finish[i] = choice["finish_reason"];
          }
        }
        return true;
      },
      path);
  EXPECT_TRUE(res);
  if (res) {
    out.status = res->status;
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  }
  EXPECT_TRUE(done) << "no [DONE]";
  EXPECT_TRUE(buffer.empty()) << buffer;
  return out;
}

// A posted pipeline's server-sent events in order, each "event: NAME\ndata:
// JSON"; `keep_going` sees each as it arrives (false: hang up), `run_id`
// (when given) is the run's id before the first. Refusals are not
// streamed: post them with Client::Post.
struct PipelineEvent {
  std::string name;
  json data;
};
struct PipelineStream {
  std::vector<PipelineEvent> events;
  int status = 0;
  std::string content_type;
};
PipelineStream post_pipeline(httplib::Client& c, const json& pipeline,
                             const std::function<bool(const PipelineEvent&)>& keep_going = {},
                             std::string* run_id = nullptr) {
  PipelineStream out;
  std::string buffer;
  const auto res = post_receiving(
      c, pipeline,
      [&](const char* data, size_t len) {
        buffer.append(data, len);
        for (size_t end; (end = buffer.find("\n\n")) != std::string::npos;) {
          const std::string event = buffer.substr(0, end);
          buffer.erase(0, end + 2);
          const size_t nl = event.find('\n');
          EXPECT_EQ(event.rfind("event: ", 0), 0u) << event;
          EXPECT_NE(nl, std::string::npos) << event;
          if (nl == std::string::npos) return false;
          EXPECT_EQ(event.compare(nl + 1, 6, "data: "), 0) << event;
          EXPECT_TRUE(out.events.empty() || out.events.back().name != "result")
              << "an event after the result: " << event;
          out.events.push_back({event.substr(7, nl - 7), json::parse(event.substr(nl + 7))});
          if (keep_going && !keep_going(out.events.back())) return false;
        }
        return true;
      },
      "/v1/pipelines",
      [run_id](const httplib::Response& head) {
        if (run_id) *run_id = head.get_header_value("X-SwarmKV-Run-Id");
        return true;
      });
  if (res) {
    out.status = res->status;
    out.content_type = res->get_header_value("Content-Type");
    EXPECT_TRUE(buffer.empty()) << buffer;
  }
  return out;
}

// A re-prefill of the rendered chat in a fresh context with the server's
// settings: its greedy answer, with the margin between the best two logits
// at each step, and each answer token's text.
struct Reference : test::GreedyReference {
  std::vector<Token> prompt;
  std::vector<std::string> pieces;
};

std::vector<Token> render(const Model& model, const std::string& system, const std::string& user) {
  if (model.has_chat_template()) {
    std::vector<ChatMessage> chat;
    if (!system.empty()) chat.push_back({"system", system});
    chat.push_back({"user", user});
    return model.tokenize(model.apply_chat_template(chat, true), true);
  }
  // A model without a chat template (README, "Use it from any OpenAI client").
  return model.tokenize((system.empty() ? "" : system + "\n\n") + user + "\nAnswer:", true);
}

// A fresh context's greedy answer to `prompt`, in the server's context
// settings.
Reference reprefill_tokens(const std::shared_ptr<const Model>& model, const ServerOptions& options,
                           std::vector<Token> prompt, int max_tokens) {
  ContextOptions o = options.context;
  o.n_seq_max = static_cast<uint32_t>(options.max_live + options.max_cached);
  o.kv_unified = true;
  Context ctx(model, o);
  Reference ref;
  ref.prompt = std::move(prompt);
  ctx.decode_prompt(ref.prompt, 0, 0, true);
  GenerateOptions g;
  g.max_tokens = max_tokens;
  static_cast<test::GreedyReference&>(ref) =
      test::greedy_continuation(ctx, static_cast<Pos>(ref.prompt.size()), g);
  for (Token t : ref.tokens) ref.pieces.push_back(model->token_to_piece(t));
  return ref;
}

// Each prompt token's log probability after the tokens before it, with the
// `top` likeliest beside it (from the second token on): a lone prefill with
// every row's logits, in chunks of 100 (the server scores 64 a step; in
// exact mode a row does not depend on what else its batch holds).
std::vector<SampledLogprobs> prompt_scores(const std::shared_ptr<const Model>& model,
                                           const ServerOptions& options,
                                           const std::vector<Token>& prompt, int32_t top) {
  ContextOptions o = options.context;
  o.n_seq_max = static_cast<uint32_t>(options.max_live + options.max_cached);
  o.kv_unified = true;
  Context ctx(model, o);
  std::vector<SampledLogprobs> out;
  constexpr size_t kChunk = 100;
  for (size_t from = 0; from + 1 < prompt.size(); from += kChunk) {
    std::vector<BatchToken> batch;
    for (size_t i = from; i < std::min(from + kChunk, prompt.size() - 1); ++i) {
      batch.push_back({.token = prompt[i], .pos = static_cast<Pos>(i), .seq = 0, .logits = true});
    }
    ctx.decode(batch);
    for (size_t r = 0; r < batch.size(); ++r) {
      out.push_back(score_token(*model, ctx, static_cast<int32_t>(r), prompt[from + r + 1], top));
    }
  }
  return out;
}

Reference reprefill(const std::shared_ptr<const Model>& model, const ServerOptions& options,
                    const std::string& system, const std::string& user, int max_tokens) {
  return reprefill_tokens(model, options, render(*model, system, user), max_tokens);
}

// The server's answer equals the re-prefill's, or parts from it at a step
// where the re-prefill itself was a near-tie (README, "Fork strategies").
void expect_equal_up_to_near_tie(const std::string& answer, const Reference& ref, float margin,
                                 const std::string& name) {
  if (answer == ref.text) return;
  size_t d = 0, at = 0;
  while (d < ref.pieces.size() && answer.compare(at, ref.pieces[d].size(), ref.pieces[d]) == 0) {
    at += ref.pieces[d].size();
    ++d;
  }
  ASSERT_LT(d, ref.margins.size()) << name;
  EXPECT_LT(ref.margins[d], margin)
      << name << " parted from the re-prefill at token " << d
      << " where it was confident:\n  served: " << answer << "\n  re-prefill: " << ref.text;
}

// A --no-exact server (llama.cpp's stock kernels, cells reused): the suites
// below that test the protocol and the stock numerics; ServerExactTest
// tests the default, exact mode.
ServerOptions small_options() {
  ServerOptions o;
  o.exact = false;
  o.context.n_ctx = 4096;
  o.context.n_batch = 512;
  o.context.n_ubatch = 512;
  o.max_live = 8;
  o.max_cached = 8;
  return o;
}

// A snapshot store of its own for one test, removed at its end.
struct TempStore {
  explicit TempStore(const std::string& name)
      : path(std::filesystem::temp_directory_path() /
             ("swarmkv-serve-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~TempStore() { std::filesystem::remove_all(path); }
  TempStore(const TempStore&) = delete;
  TempStore& operator=(const TempStore&) = delete;
  std::filesystem::path path;
};

ServerOptions store_options(SnapshotCacheMode mode, const TempStore& store) {
  ServerOptions o = small_options();
  o.snapshots.cache = mode;
  o.snapshots.cache_dir = store.path.string();
  return o;
}

// ------------------------------------------------------------ both models

class ServerForkTest : public ::testing::TestWithParam<test::TestModel> {
 protected:
  void SetUp() override {
    model_ = test::load_test_model(GetParam(), ModelOptions{.batch_invariant = false});
    if (!model_) GTEST_SKIP() << GetParam().env << " is not set";
  }
  std::shared_ptr<const Model> model_;
};

TEST_P(ServerForkTest, ALoneRequestEqualsAReprefillBitForBit) {
  const ServerOptions options = small_options();
  const std::string doc = document(1500);
  const std::string user = doc + "\n\nWhat is this document about?";
  const Reference ref = reprefill(model_, options, "Answer briefly.", user, 24);
  Running server(model_, options);
  auto c = server.client();
  const json j = post_chat(*c, chat_body("Answer briefly.", user, 24));
  expect_completion_shape(j, 1);
  EXPECT_EQ(j["choices"][0]["message"]["content"], ref.text);
  EXPECT_EQ(j["usage"]["prompt_tokens"], ref.prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], ref.pieces.size());
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

// Six agents send the same document at once, each with its own question:
// the document is prefilled once, every other request forks it (and waits
// for it while it is still being prefilled), and each answer equals its own
// re-prefill up to the shared fork's near-tie bound.
TEST_P(ServerForkTest, ConcurrentAgentsOverOneDocumentPrefillItOnce) {
  const ServerOptions options = small_options();
#ifdef SWARMKV_SANITIZED  // the sanitizers look at the threads, not the numerics
  const std::string doc = document(1000);
#else
  const std::string doc = document(3000);
#endif
  const std::vector<std::string> questions = {"Who is the Licensor?",
                                              "What is a Contribution?",
                                              "What does the patent grant cover?",
                                              "What must a redistribution include?",
                                              "Does the license grant trademark rights?",
                                              "Is there a warranty?"};
  std::vector<Reference> refs;
  for (const std::string& q : questions) {
    refs.push_back(reprefill(model_, options, "", doc + "\n\n" + q, 32));
  }
  Running server(model_, options);
  std::vector<std::future<std::pair<std::string, json>>> answers;
  for (size_t i = 0; i < questions.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto c = server.client();
      const json body = chat_body("", doc + "\n\n" + questions[i], 32);
      if (i % 2 == 1) {  // half of them streamed
        const Streamed s = post_stream(*c, body);
        EXPECT_EQ(s.status, 200);
        return std::pair{s.texts[0], s.usage};
      }
      const json j = post_chat(*c, body);
      expect_completion_shape(j, 1);
      return std::pair{j["choices"][0]["message"]["content"].get<std::string>(), j["usage"]};
    }));
  }
  int64_t fresh = 0, forked = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    const auto [text, usage] = answers[i].get();
    expect_equal_up_to_near_tie(text, refs[i], 2 * GetParam().shared_logit_bound, questions[i]);
    EXPECT_EQ(usage["prompt_tokens"], refs[i].prompt.size());
    const int64_t cached = usage["prompt_tokens_details"]["cached_tokens"];
    fresh += usage["prompt_tokens"].get<int64_t>() - cached;
    // All but the first forked at least the document's tokens.
    if (cached > static_cast<int64_t>(refs[i].prompt.size()) - 40) ++forked;
  }
  EXPECT_GE(forked, static_cast<int64_t>(questions.size()) - 1);
  auto c = server.client();
  EXPECT_EQ(metric(*c, "swarmkv_prefilled_tokens_total"), static_cast<double>(fresh));
  // One prompt's worth, plus the questions.
  EXPECT_LT(fresh, static_cast<int64_t>(refs[0].prompt.size()) + 40 * 6);
  EXPECT_EQ(metric(*c, "swarmkv_live_sequences"), 0);
}

// A finished request's sequence stays cached, far past the document once it
// has answered at length. On plain attention the next request over the
// same document forks the document from it; on sliding-window layers the
// cells that left that sequence's window may already hold its later
// tokens, so the next request must not fork there — both answers stay
// within the re-prefill's near-tie bound.
TEST_P(ServerForkTest, ALaterRequestForksOnlyWhatTheCacheStillHolds) {
  ServerOptions options = small_options();
  options.context.n_ctx = 2048;
  const std::string doc = document(1000);
  const int first_tokens = GetParam().instruct ? 200 : 700;  // the base model runs to the end
  Running server(model_, options);
  auto c = server.client();
  const json first = post_chat(*c, chat_body("", doc + "\n\nRetell this text.", first_tokens));
  const Reference ref = reprefill(model_, options, "", doc + "\n\nWho is the Licensor?", 24);
  const json second = post_chat(*c, chat_body("", doc + "\n\nWho is the Licensor?", 24));
  expect_equal_up_to_near_tie(second["choices"][0]["message"]["content"], ref,
                              2 * GetParam().shared_logit_bound, "the later request");
  const int cached = second["usage"]["prompt_tokens_details"]["cached_tokens"];
  const int doc_tokens = static_cast<int>(ref.prompt.size()) - 20;
  if (kv_layout(*model_, options.context).n_swa > 0) {
    EXPECT_LT(cached, doc_tokens) << "forked cells the sliding window may have overwritten";
  } else {
    EXPECT_GE(cached, doc_tokens);
  }
  EXPECT_EQ(first["usage"]["prompt_tokens"].get<int>() +
                second["usage"]["prompt_tokens"].get<int>() - cached,
            metric(*c, "swarmkv_prefilled_tokens_total"));
}

// A chat whose prompt starts with a document prefix `swarmkv prefill` put in
// the snapshot store restores it, cut to whole micro-batches, instead of
// prefilling it, and answers as a re-prefill does, token for token. On a
// sliding-window model the store is not used (a restored sequence would sit
// in other cells than a prefill's: other rounding).
TEST_P(ServerForkTest, AStoredDocumentPrefixIsRestoredInsteadOfPrefilled) {
  const TempStore dir("prefix");
  const ServerOptions options = store_options(SnapshotCacheMode::kReadOnly, dir);
  const std::string doc = document(3000);
  const json pipeline = {{"document", {{"text", doc}}},
                         {"exact", false},  // as the server (small_options)
                         {"n_batch", options.context.n_batch},
                         {"n_ubatch", options.context.n_ubatch},
                         {"agents", json::array({{{"name", "a"}, {"prompt", "unused"}}})}};
  const PipelineSpec spec = parse_pipeline(pipeline.dump(), "test", "");
  RunOptions store;
  store.snapshot.cache = SnapshotCacheMode::kOn;
  store.snapshot.cache_dir = dir.path.string();
  ASSERT_TRUE(prefill_document(spec, model_, store).snapshot.published);
  const std::vector<Token> prefix = prepare_prefix(spec, *model_);

  Running server(model_, options);
  auto c = server.client();
  // The chat a pipeline agent's would be: its system prompt, then the
  // document and the question as the user's message.
  const std::string user = doc + "\n\nWho is the Licensor?";
  const Reference ref = reprefill(model_, options, spec.system_prompt, user, 24);
  const json answer = post_chat(*c, chat_body(spec.system_prompt, user, 24));
  const int cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"];
  size_t common = 0;
  while (common < prefix.size() && common + 1 < ref.prompt.size() &&
         prefix[common] == ref.prompt[common]) {
    ++common;
  }
  const size_t chunk = options.context.n_ubatch;
  const bool sliding_window = kv_layout(*model_, options.context).n_swa > 0;
  ASSERT_GE(common, chunk) << "the chat does not start with the stored prefix";
  EXPECT_EQ(cached, sliding_window ? 0 : static_cast<int>(common / chunk * chunk));
  EXPECT_EQ(metric(*c, "swarmkv_restored_tokens_total"), cached);
  EXPECT_EQ(metric(*c, "swarmkv_prefilled_tokens_total"),
            static_cast<double>(ref.prompt.size()) - cached);
  EXPECT_EQ(answer["choices"][0]["message"]["content"], ref.text);
  if (sliding_window) return;

  // A damaged entry is a warning: skipped, left in place (read-only), the
  // prompt prefilled, the answer the same.
  std::filesystem::path entry;
  for (const auto& e : std::filesystem::directory_iterator(dir.path)) {
    if (e.path().extension() == ".swkv") entry = e.path();
  }
  ASSERT_FALSE(entry.empty());
  {
    std::fstream f(entry, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-100, std::ios::end);
    char byte = 0;
    f.get(byte);
    f.seekp(-100, std::ios::end);
    f.put(static_cast<char>(byte ^ 0x5a));
  }
  Running again(model_, options);
  auto c2 = again.client();
  const json prefilled = post_chat(*c2, chat_body(spec.system_prompt, user, 24));
  EXPECT_EQ(prefilled["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(metric(*c2, "swarmkv_restored_tokens_total"), 0);
  EXPECT_EQ(prefilled["choices"][0]["message"]["content"], ref.text);
  EXPECT_TRUE(std::filesystem::exists(entry));
}

// A pipeline posted to the server runs as `swarmkv run` runs it: the same
// answers, token for token, in the same result schema; its events come in
// order and their texts add up to the answers.
TEST_P(ServerForkTest, APostedPipelineAnswersAsTheSameRunInProcess) {
#ifdef SWARMKV_SANITIZED
  const std::string doc = document(600);
#else
  const std::string doc = document(1500);
#endif
  const json pipeline = {
      {"name", "licence"},
      {"document", {{"text", doc}}},
      {"exact", false},  // the server is --no-exact (small_options)
      {"defaults", {{"max_tokens", 24}}},
      {"agents",
       json::array({{{"name", "who"}, {"prompt", "Who is the Licensor?"}},
                    {{"name", "what"}, {"prompt", "What is a Contribution?"}, {"stop", " is a"}},
                    {{"name", "short"},
                     {"prompt", "Say it in five words: {{who}}"},
                     {"depends_on", "who"},
                     {"max_tokens", 12}}})}};
  const PipelineResult local = run_pipeline(parse_pipeline(pipeline.dump(), "test", ""), model_);
  ASSERT_TRUE(local.ok());
  Running server(model_, small_options());
  auto c = server.client();
  const PipelineStream st = post_pipeline(*c, pipeline);
  ASSERT_EQ(st.status, 200);
  EXPECT_EQ(st.content_type, "text/event-stream");
  ASSERT_FALSE(st.events.empty());
  ASSERT_EQ(st.events.back().name, "result");
  const json& result = st.events.back().data;
  EXPECT_EQ(result["schema_version"], kResultSchemaVersion);
  EXPECT_TRUE(result["ok"].get<bool>()) << result.dump(1);
  EXPECT_EQ(result["fork"], "shared");
  EXPECT_EQ(result["prefix_tokens"], local.prefix_tokens);
  // The model's file name, never where the server keeps it.
  EXPECT_EQ(result["model"], std::filesystem::path(model_->path()).filename().string());

  std::map<std::string, std::string> streamed, done_answer;
  std::map<std::string, size_t> tokens, started, done;
  size_t prefill_done = 0;
  for (const PipelineEvent& e : st.events) {
    if (e.name == "prefill") {
      if (e.data["done"] == e.data["total"]) prefill_done = e.data["done"].get<size_t>();
    } else if (e.name == "agent_started") {
      const std::string a = e.data["agent"];
      EXPECT_EQ(started[a]++, 0u) << a << " started twice";
      if (a == "short") {
        EXPECT_EQ(done["who"], 1u) << "short started before who ended";
      }
    } else if (e.name == "token") {
      const std::string a = e.data["agent"];
      EXPECT_EQ(started[a], 1u) << a << ": a token before agent_started";
      EXPECT_EQ(done[a], 0u) << a << ": a token after agent_done";
      streamed[a] += e.data["text"].get<std::string>();
      if (!e.data["token"].is_null()) ++tokens[a];
    } else if (e.name == "agent_done") {
      const std::string a = e.data["name"];
      EXPECT_EQ(done[a]++, 0u) << a << " done twice";
      EXPECT_EQ(e.data["status"], "ok") << e.data;
      done_answer[a] = e.data["answer"];
    } else {
      EXPECT_EQ(e.name, "result") << e.data;
    }
  }
  EXPECT_EQ(prefill_done, static_cast<size_t>(local.prefix_tokens));
  // The stop string spans tokens: its first ones were held back, not sent.
  EXPECT_EQ(result["agents"][1]["stop_reason"], "stop_string");
  ASSERT_EQ(result["agents"].size(), local.agents.size());
  for (size_t i = 0; i < local.agents.size(); ++i) {
    const AgentResult& want = local.agents[i];
    const json& got = result["agents"][i];
    EXPECT_EQ(got["name"], want.name);
    EXPECT_EQ(got["answer"], want.answer) << want.name;
    EXPECT_EQ(got["tokens"], json(want.tokens)) << want.name;
    EXPECT_EQ(got["prompt_rendered"], want.prompt_rendered) << want.name;
    EXPECT_EQ(streamed[want.name], want.answer) << want.name;
    EXPECT_EQ(done_answer[want.name], want.answer) << want.name;
    EXPECT_EQ(tokens[want.name], want.tokens.size()) << want.name;
    EXPECT_EQ(started[want.name], 1u) << want.name;
    EXPECT_EQ(done[want.name], 1u) << want.name;
  }
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, ServerForkTest, SWARMKV_FORK_TEST_MODELS,
                         test::test_model_name);

// ------------------------------------------------------------ exact mode

// `serve --exact` (ServerOptions::exact): every answer equals its
// re-prefill's bit for bit, however many requests share its batches, also
// after the cache started over. The model is loaded as exact mode needs it.
class ServerExactTest : public ::testing::TestWithParam<test::TestModel> {
 protected:
  void SetUp() override {
    try {
      model_ = test::load_test_model(GetParam(), ModelOptions{.batch_invariant = true});
    } catch (const Error& e) {  // another test of this process decoded first
      GTEST_SKIP() << "needs a process of its own (ctest runs each case alone): " << e.what();
    }
    if (!model_) GTEST_SKIP() << GetParam().env << " is not set";
  }
  static ServerOptions exact_options(uint32_t n_ctx) {
    ServerOptions o = small_options();
    o.exact = true;
    o.context.flash_attn = true;  // as the server turns it on; the re-prefill reads it here
    // The K/V type `serve` gets by default (EngineSettings::context_options: q8_0 where flash
    // attention runs), as a pipeline's prefill stores it.
    o.context.type_k = o.context.type_v = KvType::kQ8_0;
    o.context.n_ctx = n_ctx;
    return o;
  }
  std::shared_ptr<const Model> model_;
};

// Six agents at once over one document: it is prefilled once, and every
// answer is its re-prefill's, token for token. A later question forks the
// document from a finished sequence — on sliding-window layers too, since
// exact mode overwrites no cell — and answers as its re-prefill does.
TEST_P(ServerExactTest, ConcurrentAgentsAnswerAsAReprefillBitForBit) {
  const ServerOptions options = exact_options(4096);
#ifdef SWARMKV_SANITIZED
  const std::string doc = document(800);
  const int max_tokens = 12;
#else
  const std::string doc = document(3000);
  const int max_tokens = 32;
#endif
  const std::vector<std::string> questions = {"Who is the Licensor?",
                                              "What is a Contribution?",
                                              "What does the patent grant cover?",
                                              "What must a redistribution include?",
                                              "Does the license grant trademark rights?",
                                              "Is there a warranty?"};
  std::vector<Reference> refs;
  for (const std::string& q : questions) {
    refs.push_back(reprefill(model_, options, "", doc + "\n\n" + q, max_tokens));
  }
  Running server(model_, options);
  std::vector<std::future<std::pair<std::string, json>>> answers;
  for (size_t i = 0; i < questions.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto c = server.client();
      const json body = chat_body("", doc + "\n\n" + questions[i], max_tokens);
      if (i % 2 == 1) {
        const Streamed st = post_stream(*c, body);
        EXPECT_EQ(st.status, 200);
        return std::pair{st.texts[0], st.usage};
      }
      const json j = post_chat(*c, body);
      return std::pair{j["choices"][0]["message"]["content"].get<std::string>(), j["usage"]};
    }));
  }
  int64_t fresh = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    const auto [text, usage] = answers[i].get();
    EXPECT_EQ(text, refs[i].text) << questions[i];
    EXPECT_EQ(usage["completion_tokens"], refs[i].tokens.size()) << questions[i];
    fresh += usage["prompt_tokens"].get<int64_t>() -
             usage["prompt_tokens_details"]["cached_tokens"].get<int64_t>();
  }
  EXPECT_LT(fresh, static_cast<int64_t>(refs[0].prompt.size()) + 40 * 6);

  const Reference later = reprefill(model_, options, "", doc + "\n\nWho may use it?", max_tokens);
  auto c = server.client();
  const json j = post_chat(*c, chat_body("", doc + "\n\nWho may use it?", max_tokens));
  EXPECT_EQ(j["choices"][0]["message"]["content"], later.text);
  EXPECT_GE(j["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
            static_cast<int64_t>(later.prompt.size()) - 20);
  EXPECT_EQ(metric(*c, "swarmkv_kv_resets_total"), 0);
  EXPECT_EQ(metric(*c, "swarmkv_live_sequences"), 0);
}

// response_format: a json_schema or json_object request is sampled under the
// grammar made from it, beside a free-text request in the same steps, and
// answers as a re-prefill sampled under the same grammar, token for token.
// A complete answer parses and satisfies the schema; one cut by max_tokens
// says so (finish_reason "length") and does not parse.
TEST_P(ServerExactTest, JsonResponseFormatsAnswerAsAConstrainedReprefill) {
  const ServerOptions options = exact_options(4096);
#ifdef SWARMKV_SANITIZED
  const std::string doc = document(600);
#else
  const std::string doc = document(1500);
#endif
  const int max_tokens = 48;
  const json schema = json::parse(R"({"type": "object", "properties": {"licensor": {"type":
      "string", "maxLength": 24}}, "required": ["licensor"]})");
  const std::string user = doc + "\n\nWho is the Licensor? Answer in JSON.";
  std::vector<json> formats = {
      {{"type", "json_schema"},
       {"json_schema", {{"name", "who"}, {"strict", true}, {"schema", schema}}}},
      {{"type", "json_object"}},
      nullptr};
  std::vector<std::string> grammars = {grammar_from_json_schema(schema.dump()),
                                       grammar_from_json_schema(R"({"type": "object"})"), ""};
  std::vector<Generation> refs;
  for (const std::string& grammar : grammars) {
    ContextOptions o = options.context;
    o.n_seq_max = static_cast<uint32_t>(options.max_live + options.max_cached);
    o.kv_unified = true;
    Context ctx(model_, o);
    const std::vector<Token> prompt = render(*model_, "", user);
    ctx.decode_prompt(prompt, 0, 0, true);
    SamplingOptions sampling;
    sampling.grammar = grammar;
    Sampler sampler(*model_, sampling);
    GenerateOptions g;
    g.max_tokens = max_tokens;
    refs.push_back(generate(ctx, sampler, 0, static_cast<Pos>(prompt.size()), g));
  }
  Running server(model_, options);
  std::vector<std::future<json>> answers;
  for (size_t i = 0; i < formats.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto c = server.client();
      json body = chat_body("", user, max_tokens);
      if (!formats[i].is_null()) body["response_format"] = formats[i];
      return post_chat(*c, body);
    }));
  }
  for (size_t i = 0; i < formats.size(); ++i) {
    const json j = answers[i].get();
    const std::string content = j["choices"][0]["message"]["content"];
    EXPECT_EQ(content, refs[i].text) << i;
    const bool complete = refs[i].stop_reason == StopReason::kEndOfGeneration;
    EXPECT_EQ(j["choices"][0]["finish_reason"], complete ? "stop" : "length") << i;
    if (i == 2) continue;
    const json parsed = json::parse(content, nullptr, /*allow_exceptions=*/false);
    EXPECT_EQ(parsed.is_discarded(), !complete) << i << ": " << content;
    if (complete) {
      EXPECT_TRUE(parsed.is_object()) << content;
    }
  }
  // The schema's answer is short enough to complete: it names the licensor.
  ASSERT_EQ(refs[0].stop_reason, StopReason::kEndOfGeneration) << refs[0].text;
  const json who = json::parse(refs[0].text);
  ASSERT_TRUE(who.contains("licensor") && who["licensor"].is_string()) << refs[0].text;
  EXPECT_LE(who["licensor"].get<std::string>().size(), 24u);
  EXPECT_NE(refs[0].text, refs[2].text) << "the grammar changed nothing: is it applied?";
}

// A cache too small for all requests at once, and no finished sequence
// kept (its cells are parked while others run): the requests that do not
// fit wait for the live ones to finish, the cache starts over (at least
// once), and every answer is still its re-prefill's, token for token.
// Without "seed" each request samples from a seed of its own, which comes
// back in X-SwarmKV-Seed; sent back as "seed", it gives the same answer
// (exact mode: the same bits whichever cached sequence a request forks).
TEST_P(ServerExactTest, AnUnseededRequestDrawsItsSeedAndReturnsIt) {
  Running server(model_, exact_options(1024));
  auto c = server.client();
  json body = chat_body("", "Invent a name for a new colour.", 12);
  body["temperature"] = 1.5;
  std::set<std::string> seeds, answers;
  std::string seed, answer;
  for (int i = 0; i < 4; ++i) {
    const auto res = c->Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(res && res->status == 200);
    seed = res->get_header_value("X-SwarmKV-Seed");
    ASSERT_FALSE(seed.empty());
    seeds.insert(seed);
    answer = json::parse(res->body)["choices"][0]["message"]["content"];
    answers.insert(answer);
  }
  EXPECT_EQ(seeds.size(), 4u);
  EXPECT_GT(answers.size(), 1u) << "four unseeded sampled requests gave one answer";
  body["seed"] = std::stoll(seed);
  EXPECT_EQ(post_chat(*c, body)["choices"][0]["message"]["content"], answer);
  const Streamed st = post_stream(*c, body);
  EXPECT_EQ(st.texts[0], answer);
}

// logprobs: every answer token's, with the top ones beside it, in OpenAI's
// shape: log probabilities <= 0, the top ones most likely first, greedy's
// token the likeliest, their mass <= 1; the same bits for a request alone
// and in a batch of 16 sharing its document, and streamed.
TEST_P(ServerExactTest, LogprobsAreTheSameAloneAndInABatch) {
  Running server(model_, exact_options(2048));
  const std::string doc = document(300);
  const auto body = [&](int i) {
    json b = chat_body("", doc + "\n\nQuestion " + std::to_string(i) + ": who may use it?", 8);
    b["logprobs"] = true;
    b["top_logprobs"] = 3;
    return b;
  };
  auto c = server.client();
  const json alone = post_chat(*c, body(0))["choices"][0];
  const json& content = alone["logprobs"]["content"];
  ASSERT_EQ(content.size(), 8u) << alone;
  std::string text;
  for (const json& t : content) {
    text += t["token"].get<std::string>();
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_EQ(t["top_logprobs"][0]["token"], t["token"]) << "greedy took another token";
    EXPECT_EQ(t["top_logprobs"][0]["logprob"], t["logprob"]);
    double mass = 0;
    for (size_t k = 0; k < 3; ++k) {
      mass += std::exp(t["top_logprobs"][k]["logprob"].get<double>());
      if (k > 0) {
        EXPECT_LE(t["top_logprobs"][k]["logprob"], t["top_logprobs"][k - 1]["logprob"]);
      }
    }
    EXPECT_LE(mass, 1.0 + 1e-6);
    EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
  }
  EXPECT_EQ(text, alone["message"]["content"]);

  std::vector<std::future<json>> batch;
  for (int i = 15; i >= 0; --i) {
    batch.push_back(std::async(std::launch::async, [&, i] {
      auto ci = server.client();
      return post_chat(*ci, body(i))["choices"][0]["logprobs"];
    }));
  }
  std::vector<json> got;
  for (auto& f : batch) got.push_back(f.get());
  EXPECT_EQ(got.back(), alone["logprobs"]) << "question 0 in a batch of 16";
  const Streamed st = post_stream(*c, body(0));
  EXPECT_EQ(st.texts[0], alone["message"]["content"]);
  EXPECT_EQ(st.logprobs[0], alone["logprobs"]["content"]);
}

// POST /v1/completions continues its prompt as written (no chat template):
// four prompts over one document at once, two streamed, each answer its
// re-prefill's token for token; logprobs in the endpoint's own shape;
// n = 2 greedy gives two equal choices. OpenAI's default max_tokens is 16.
TEST_P(ServerExactTest, TextCompletionsContinueTheirPromptAsAReprefill) {
  const ServerOptions options = exact_options(4096);
  const std::string doc = document(1200);
  const int max_tokens = 12;
  std::vector<std::string> prompts;
  std::vector<Reference> refs;
  for (int i = 0; i < 4; ++i) {
    prompts.push_back(doc + "\n\nQuestion " + std::to_string(i) + ": who may use it?\nAnswer:");
    refs.push_back(reprefill_tokens(model_, options, model_->tokenize(prompts.back(), true, true),
                                    max_tokens));
  }
  Running server(model_, options);
  std::vector<std::future<std::pair<std::string, std::string>>> answers;
  for (size_t i = 0; i < prompts.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto c = server.client();
      const json body = {{"prompt", prompts[i]}, {"max_tokens", max_tokens}, {"temperature", 0}};
      if (i % 2 == 1) {
        const Streamed st = post_stream(*c, body, 1, "/v1/completions");
        EXPECT_EQ(st.usage["completion_tokens"], refs[i].tokens.size());
        return std::pair{st.texts[0], st.finish[0]};
      }
      const json j = post_chat(*c, body, "/v1/completions");
      EXPECT_EQ(j["object"], "text_completion");
      EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u) << j["id"];
      EXPECT_EQ(j["usage"]["prompt_tokens"], refs[i].prompt.size());
      EXPECT_EQ(j["usage"]["completion_tokens"], refs[i].tokens.size());
      EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
      return std::pair{j["choices"][0]["text"].get<std::string>(),
                       j["choices"][0]["finish_reason"].get<std::string>()};
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto [text, finish] = answers[i].get();
    EXPECT_EQ(text, refs[i].text) << prompts[i].substr(doc.size());
    EXPECT_EQ(finish, refs[i].tokens.size() == static_cast<size_t>(max_tokens) ? "length" : "stop");
  }

  auto c = server.client();
  const json j = post_chat(*c,
                           {{"prompt", json::array({prompts[0]})},
                            {"max_tokens", max_tokens},
                            {"temperature", 0},
                            {"logprobs", 2},
                            {"n", 2}},
                           "/v1/completions");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["text"], refs[0].text);
  EXPECT_EQ(j["choices"][1]["text"], refs[0].text);
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), refs[0].tokens.size()) << lp;
  std::string joined;
  size_t offset = prompts[0].size();
  for (size_t k = 0; k < lp["tokens"].size(); ++k) {
    const std::string piece = lp["tokens"][k];
    EXPECT_EQ(piece, refs[0].pieces[k]);
    EXPECT_EQ(lp["text_offset"][k], offset) << k;
    offset += piece.size();
    joined += piece;
    EXPECT_LE(lp["token_logprobs"][k].get<double>(), 0.0);
    const json& top = lp["top_logprobs"][k];
    EXPECT_LE(top.size(), 2u);
    ASSERT_TRUE(top.contains(piece)) << "greedy's token is the likeliest: " << top;
    EXPECT_EQ(top[piece], lp["token_logprobs"][k]);
  }
  EXPECT_EQ(joined, refs[0].text);
  const Streamed st = post_stream(
      *c, {{"prompt", prompts[0]}, {"max_tokens", max_tokens}, {"temperature", 0}, {"logprobs", 2}},
      1, "/v1/completions");
  EXPECT_EQ(st.logprobs[0], lp);
  // Several prompts in one request (as LangChain's OpenAI LLM batches
  // them): prompt p's choice j is choice p * n + j, each the prompt's own
  // re-prefill; usage counts every prompt; streamed the same.
  const json batch = {{"prompt", prompts},
                      {"max_tokens", max_tokens},
                      {"temperature", 0},
                      {"logprobs", 0},
                      {"n", 2}};
  const json all = post_chat(*c, batch, "/v1/completions");
  ASSERT_EQ(all["choices"].size(), 2 * prompts.size()) << all;
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    prompt_tokens += static_cast<int64_t>(refs[p].prompt.size());
    completion_tokens += 2 * static_cast<int64_t>(refs[p].tokens.size());
    for (size_t k = 0; k < 2; ++k) {
      const json& choice = all["choices"][2 * p + k];
      EXPECT_EQ(choice["index"], 2 * p + k);
      EXPECT_EQ(choice["text"], refs[p].text) << "prompt " << p << ", choice " << k;
      EXPECT_EQ(choice["logprobs"]["text_offset"][0], prompts[p].size());
    }
  }
  EXPECT_EQ(all["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(all["usage"]["completion_tokens"], completion_tokens);
  const Streamed streamed =
      post_stream(*c, batch, static_cast<int>(2 * prompts.size()), "/v1/completions");
  for (size_t i = 0; i < 2 * prompts.size(); ++i) EXPECT_EQ(streamed.texts[i], refs[i / 2].text);
  // Without max_tokens: OpenAI's 16.
  const json dflt =
      post_chat(*c, {{"prompt", "Once upon a time"}, {"temperature", 0}}, "/v1/completions");
  EXPECT_LE(dflt["usage"]["completion_tokens"].get<int>(), 16);

  // Echo: each choice's text starts with its prompt; with logprobs the
  // prompt's tokens come first (a BOS the tokenizer added left out, a first
  // token with nothing before it null), each scored as a lone prefill
  // scores it (in other chunks), bit for bit, though the cache holds this
  // prompt (a prefix of the others): an echoed prompt is prefilled whole.
  const std::string echoed = prompts[1].substr(0, 700);
  const std::vector<Token> echoed_tokens = model_->tokenize(echoed, true, true);
  // Gemma 3 scores 128 rows a step (scored_rows_per_step): two steps.
  ASSERT_GT(echoed_tokens.size(), 128u);
  const Reference echo_ref = reprefill_tokens(model_, options, echoed_tokens, max_tokens);
  const std::vector<SampledLogprobs> scores = prompt_scores(model_, options, echoed_tokens, 2);
  const size_t added = echoed_tokens.size() - model_->tokenize(echoed, false, true).size();
  const json echo_body = {{"prompt", echoed}, {"max_tokens", max_tokens},
                          {"temperature", 0}, {"logprobs", 2},
                          {"echo", true},     {"n", 2}};
  const json e = post_chat(*c, echo_body, "/v1/completions");
  ASSERT_EQ(e["choices"].size(), 2u) << e;
  for (const json& choice : e["choices"]) {
    EXPECT_EQ(choice["text"], echoed + echo_ref.text);
    const json& elp = choice["logprobs"];
    ASSERT_EQ(elp["tokens"].size(), echoed_tokens.size() - added + echo_ref.tokens.size()) << elp;
    std::string all_text;
    for (size_t k = 0; k < elp["tokens"].size(); ++k) {
      EXPECT_EQ(elp["text_offset"][k], all_text.size()) << k;
      all_text += elp["tokens"][k].get<std::string>();
      const size_t token = k + added;  // in echoed_tokens, then the answer's
      if (token == 0) {
        EXPECT_TRUE(elp["token_logprobs"][k].is_null());
        EXPECT_TRUE(elp["top_logprobs"][k].is_null());
      } else if (token < echoed_tokens.size()) {
        const SampledLogprobs& want = scores[token - 1];
        EXPECT_EQ(elp["tokens"][k], want.sampled.text) << k;
        EXPECT_EQ(elp["token_logprobs"][k].get<float>(), want.sampled.logprob) << k;
        ASSERT_EQ(want.top.size(), 2u);
        EXPECT_EQ(elp["top_logprobs"][k][want.top[0].text].get<float>(), want.top[0].logprob);
      } else {
        EXPECT_EQ(elp["tokens"][k], echo_ref.pieces[token - echoed_tokens.size()]) << k;
      }
    }
    EXPECT_EQ(all_text, echoed + echo_ref.text);
  }
  EXPECT_EQ(e["usage"]["prompt_tokens"], echoed_tokens.size());
  EXPECT_EQ(e["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const Streamed echo_stream = post_stream(*c, echo_body, 2, "/v1/completions");
  for (size_t k = 0; k < 2; ++k) {
    EXPECT_EQ(echo_stream.texts[k], echoed + echo_ref.text);
    EXPECT_EQ(echo_stream.logprobs[k], e["choices"][k]["logprobs"]);
  }
  // max_tokens 0 with echo (older loglikelihood clients): the prompt
  // alone, its scores the same, nothing generated.
  json prompt_only = echo_body;
  prompt_only["max_tokens"] = 0;
  const json po = post_chat(*c, prompt_only, "/v1/completions");
  ASSERT_EQ(po["choices"].size(), 2u) << po;
  EXPECT_EQ(po["choices"][1]["text"], echoed);
  EXPECT_EQ(po["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(po["usage"]["completion_tokens"], 0);
  const json& plp = po["choices"][1]["logprobs"];
  ASSERT_EQ(plp["token_logprobs"].size(), echoed_tokens.size() - added) << plp;
  for (size_t k = 0; k < plp["token_logprobs"].size(); ++k) {
    EXPECT_EQ(plp["token_logprobs"][k], e["choices"][0]["logprobs"]["token_logprobs"][k]) << k;
  }
  // Token ids (as lm-eval's completions client sends them by default):
  // decoded as given, answered as the text they came from; a list of them;
  // echo repeats their text, control tokens rendered, each id listed; an
  // id outside the vocabulary is a 400 naming it.
  const json by_ids =
      post_chat(*c, {{"prompt", refs[0].prompt}, {"max_tokens", max_tokens}, {"temperature", 0}},
                "/v1/completions");
  EXPECT_EQ(by_ids["choices"][0]["text"], refs[0].text);
  EXPECT_EQ(by_ids["usage"]["prompt_tokens"], refs[0].prompt.size());
  const json two_ids = post_chat(*c,
                                 {{"prompt", json::array({refs[2].prompt, refs[3].prompt})},
                                  {"max_tokens", max_tokens},
                                  {"temperature", 0}},
                                 "/v1/completions");
  ASSERT_EQ(two_ids["choices"].size(), 2u);
  EXPECT_EQ(two_ids["choices"][0]["text"], refs[2].text);
  EXPECT_EQ(two_ids["choices"][1]["text"], refs[3].text);
  const json echo_ids = post_chat(*c,
                                  {{"prompt", echoed_tokens},
                                   {"max_tokens", max_tokens},
                                   {"temperature", 0},
                                   {"logprobs", 0},
                                   {"echo", true}},
                                  "/v1/completions");
  const std::string ids_text = model_->detokenize(echoed_tokens, /*special=*/true);
  EXPECT_EQ(echo_ids["choices"][0]["text"], ids_text + echo_ref.text);
  const json& ilp = echo_ids["choices"][0]["logprobs"];
  ASSERT_EQ(ilp["token_logprobs"].size(), echoed_tokens.size() + echo_ref.tokens.size()) << ilp;
  EXPECT_TRUE(ilp["token_logprobs"][0].is_null());
  for (size_t k = 1; k < echoed_tokens.size(); ++k) {
    EXPECT_EQ(ilp["token_logprobs"][k].get<float>(), scores[k - 1].sampled.logprob) << k;
  }
  const auto outside = c->Post("/v1/completions", json{{"prompt", {1, model_->n_vocab()}}}.dump(),
                               "application/json");
  ASSERT_TRUE(outside);
  EXPECT_EQ(outside->status, 400);
  EXPECT_EQ(json::parse(outside->body)["error"]["message"],
            fmt::format("prompt: token {} (prompt 0, position 1) is not in the model's vocabulary "
                        "(ids 0 to {})",
                        model_->n_vocab(), model_->n_vocab() - 1));
  // Without logprobs the prompt is repeated and forked from the cache as
  // any other.
  const json plain_echo = post_chat(
      *c, {{"prompt", echoed}, {"max_tokens", max_tokens}, {"temperature", 0}, {"echo", true}},
      "/v1/completions");
  EXPECT_EQ(plain_echo["choices"][0]["text"], echoed + echo_ref.text);
  EXPECT_TRUE(plain_echo["choices"][0]["logprobs"].is_null());
  EXPECT_GT(plain_echo["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0);
}

TEST_P(ServerExactTest, TheCacheStartsOverWhenItsCellsRunOut) {
  ServerOptions options = exact_options(512);
  options.max_cached = 0;
  const std::vector<std::string> docs = {document(700), document(700, "mpl-2.0.txt"),
                                         document(1400).substr(700)};
  const std::vector<std::string> questions = {"Who is named here?", "What is this about?"};
  std::vector<std::string> users;
  std::vector<Reference> refs;
  for (const std::string& d : docs) {
    for (const std::string& q : questions) {
      users.push_back(d + "\n\n" + q);
      refs.push_back(reprefill(model_, options, "", users.back(), 24));
    }
  }
  Running server(model_, options);
  std::vector<std::future<std::string>> answers;
  for (size_t i = 0; i < users.size(); ++i) {
    answers.push_back(std::async(std::launch::async, [&, i] {
      auto c = server.client();
      const json j = post_chat(*c, chat_body("", users[i], 24));
      return j.is_null() ? std::string() : j["choices"][0]["message"]["content"].get<std::string>();
    }));
  }
  for (size_t i = 0; i < users.size(); ++i) EXPECT_EQ(answers[i].get(), refs[i].text) << i;
  auto c = server.client();
  EXPECT_GE(metric(*c, "swarmkv_kv_resets_total"), 1);
  // Once more, the first one: after the cache started over.
  const json again = post_chat(*c, chat_body("", users[0], 24));
  EXPECT_EQ(again["choices"][0]["message"]["content"], refs[0].text);
  EXPECT_EQ(metric(*c, "swarmkv_live_sequences"), 0);
}

// An exact server takes exact pipelines, and they answer as the same run in
// process.
// A pipeline that does not say is exact (the default) on an exact server,
// and answers as the same pipeline run in process by default.
// A structured answer travels too: a schema agent's answer_json, and a
// field of it in a downstream agent's prompt.
TEST_P(ServerExactTest, APostedPipelineIsExactByDefaultAndAnswersAsTheSameRunInProcess) {
  const json schema = {{"type", "object"},
                       {"properties", {{"licence", {{"type", "boolean"}}}}},
                       {"required", {"licence"}}};
  const json pipeline = {
      {"document", {{"text", document(800)}}},
      {"defaults", {{"max_tokens", 16}}},
      {"agents",
       json::array({{{"name", "who"}, {"prompt", "Who is the Licensor?"}, {"top_logprobs", 2}},
                    {{"name", "what"}, {"prompt", "What is a Contribution?"}},
                    {{"name", "is"}, {"prompt", "Is this a licence?"}, {"json_schema", schema}},
                    {{"name", "why"},
                     {"depends_on", {"is"}},
                     {"prompt", "Someone answered {{is.licence}}. Why?"}},
                    json::parse(R"({"name": "call", "prompt": "Who grants the licence?",
                        "max_tokens": 48, "tools": [{"name": "name_party", "parameters":
                        {"type": "object", "properties": {"party": {"type": "string",
                        "maxLength": 20}}, "required": ["party"]}}]})")})}};
  const PipelineResult local = run_pipeline(parse_pipeline(pipeline.dump(), "test", ""), model_);
  ASSERT_TRUE(local.ok());
  EXPECT_TRUE(local.exact);
  Running server(model_, exact_options(2048));
  auto c = server.client();
  const auto res = c->Post("/v1/pipelines?stream=false", pipeline.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json result = json::parse(res->body);
  EXPECT_TRUE(result["exact"].get<bool>());
  ASSERT_EQ(result["agents"].size(), local.agents.size());
  for (size_t i = 0; i < local.agents.size(); ++i) {
    EXPECT_EQ(result["agents"][i]["tokens"], json(local.agents[i].tokens)) << local.agents[i].name;
    EXPECT_EQ(result["agents"][i]["logprobs"], logprobs_json(local.agents[i].logprobs))
        << local.agents[i].name;
  }
  ASSERT_FALSE(local.agents[0].logprobs.empty());
  EXPECT_EQ(result["agents"][0]["logprobs"][0]["top_logprobs"].size(), 2u);
  const json& is = result["agents"][2];
  ASSERT_TRUE(is.contains("answer_json")) << is;
  EXPECT_TRUE(is["answer_json"]["licence"].is_boolean()) << is;
  EXPECT_EQ(result["agents"][3]["prompt_rendered"],
            "Someone answered " + is["answer_json"]["licence"].dump() + ". Why?");
  // A tool agent's answer is the call, as in process.
  const json& call = result["agents"][4];
  ASSERT_EQ(call["status"], "ok") << call;
  EXPECT_EQ(call["answer_json"]["name"], "name_party") << call;
  EXPECT_TRUE(call["answer_json"]["arguments"]["party"].is_string()) << call;
}

// A document prefix an exact prefill stored is restored whole (no cut to
// micro-batches), on sliding-window layers too, and the answer is the
// re-prefill's, token for token.
TEST_P(ServerExactTest, AStoredDocumentPrefixIsRestoredWholeAndAnswersBitForBit) {
  const TempStore dir("exact-prefix");
  ServerOptions options = exact_options(4096);
  options.snapshots.cache = SnapshotCacheMode::kReadOnly;
  options.snapshots.cache_dir = dir.path.string();
  // Long enough for a lookup: one micro-batch (512) or more to restore.
  const std::string doc = document(3000);
  const json pipeline = {{"document", {{"text", doc}}},
                         {"exact", true},
                         {"n_batch", options.context.n_batch},
                         {"n_ubatch", options.context.n_ubatch},
                         {"agents", json::array({{{"name", "a"}, {"prompt", "unused"}}})}};
  const PipelineSpec spec = parse_pipeline(pipeline.dump(), "test", "");
  RunOptions store;
  store.snapshot.cache = SnapshotCacheMode::kOn;
  store.snapshot.cache_dir = dir.path.string();
  ASSERT_TRUE(prefill_document(spec, model_, store).snapshot.published);
  const std::vector<Token> prefix = prepare_prefix(spec, *model_);

  Running server(model_, options);
  auto c = server.client();
  const std::string user = doc + "\n\nWho is the Licensor?";
  const Reference ref = reprefill(model_, options, spec.system_prompt, user, 24);
  const json answer = post_chat(*c, chat_body(spec.system_prompt, user, 24));
  size_t common = 0;
  while (common < prefix.size() && common + 1 < ref.prompt.size() &&
         prefix[common] == ref.prompt[common]) {
    ++common;
  }
  ASSERT_GE(common, static_cast<size_t>(options.context.n_ubatch))
      << "the chat does not start with the stored prefix";
  EXPECT_EQ(answer["usage"]["prompt_tokens_details"]["cached_tokens"], common);
  EXPECT_EQ(metric(*c, "swarmkv_restored_tokens_total"), static_cast<double>(common));
  EXPECT_EQ(metric(*c, "swarmkv_prefilled_tokens_total"),
            static_cast<double>(ref.prompt.size() - common));
  EXPECT_EQ(answer["choices"][0]["message"]["content"], ref.text);
}

// An agent that needs the document's start: a posted pipeline streams the
// prefill beside that agent's steps and publishes it once it ends, as `run`
// does, so the next post restores it and answers the same. Not on
// sliding-window layers, whose per-sequence export keeps only the window:
// there the next post streams again.
TEST_P(ServerExactTest, APostedStreamedPrefillIsPublishedForTheNextPost) {
  const TempStore dir("streamed");
  ServerOptions options = exact_options(2048);
  options.snapshots.cache = SnapshotCacheMode::kOn;
  options.snapshots.cache_dir = dir.path.string();
  // Over one micro-batch (512), so that the agent starts before it ends.
  const json pipeline = {{"document", {{"text", document(3000)}}},
                         {"agents", json::array({{{"name", "a"},
                                                  {"prompt", "Who is the Licensor?"},
                                                  {"max_tokens", 8},
                                                  {"needs", {{"tokens", 16}}}}})}};
  Running server(model_, options);
  auto c = server.client();
  const auto post = [&] {
    const auto res = c->Post("/v1/pipelines?stream=false", pipeline.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return json();
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body);
  };
  const json cold = post();
  const json warm = post();
  ASSERT_TRUE(cold.is_object() && warm.is_object());
  EXPECT_EQ(cold["snapshot"]["source"], "prefill");
  EXPECT_LT(cold["agents"][0]["started_at_ms"].get<double>(),
            cold["prefill_done_at_ms"].get<double>())
      << "the agent did not start during the prefill: nothing was streamed";
  EXPECT_EQ(warm["agents"][0]["tokens"], cold["agents"][0]["tokens"]);
  if (kv_layout(*model_, options.context).n_swa > 0) {
    EXPECT_FALSE(cold["snapshot"]["published"].get<bool>());
    EXPECT_EQ(warm["snapshot"]["source"], "prefill");
    return;
  }
  EXPECT_TRUE(cold["snapshot"]["published"].get<bool>());
  EXPECT_EQ(warm["snapshot"]["source"], "cache");
  EXPECT_EQ(warm["snapshot"]["reused_tokens"], cold["prefix_tokens"]);
  EXPECT_EQ(warm["document_prefills"], 0);
}

INSTANTIATE_TEST_SUITE_P(BothArchitectures, ServerExactTest, SWARMKV_FORK_TEST_MODELS,
                         test::test_model_name);

// ------------------------------------------------------------ HTTP behaviour

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = test::load_test_model(test::kSmolLM2, ModelOptions{.batch_invariant = false});
    if (!model_) GTEST_SKIP() << "SWARMKV_TEST_MODEL is not set";
  }
  std::shared_ptr<const Model> model_;
};

TEST_F(ServerTest, AKeyIsNeededOnEveryRouteButHealth) {
  ServerOptions o = small_options();
  o.api_key = "sekret";
  Running server(model_, o);
  auto anon = server.client();
  auto wrong = server.client("sekre");
  auto right = server.client("sekret");
  EXPECT_EQ(anon->Get("/health")->status, 200);
  for (const char* path : {"/v1/models", "/metrics"}) {
    const auto res = anon->Get(path);
    EXPECT_EQ(res->status, 401) << path;
    const json e = json::parse(res->body);
    EXPECT_EQ(e["error"]["code"], "invalid_api_key");
    EXPECT_EQ(e["error"]["message"],
              "missing or wrong API key: send the header 'Authorization: Bearer <key>'");
    EXPECT_EQ(wrong->Get(path)->status, 401) << path;
    EXPECT_EQ(right->Get(path)->status, 200) << path;
  }
  // The scheme's name in any case, as HTTP has it; the key itself exactly.
  for (const char* header : {"bearer sekret", "BEARER sekret", "Bearer sekret"}) {
    EXPECT_EQ(anon->Get("/v1/models", {{"Authorization", header}})->status, 200) << header;
  }
  for (const char* header : {"bearer SEKRET", "Basic sekret", "bearer", "bearersekret"}) {
    EXPECT_EQ(anon->Get("/v1/models", {{"Authorization", header}})->status, 401) << header;
  }
  const json body = chat_body("", "Hi", 2);
  EXPECT_EQ(anon->Post("/v1/chat/completions", body.dump(), "application/json")->status, 401);
  EXPECT_EQ(right->Post("/v1/chat/completions", body.dump(), "application/json")->status, 200);
  const json models = json::parse(right->Get("/v1/models")->body);
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][0]["id"], "SmolLM2-135M-Instruct.F16.gguf");
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][1]["id"], "swarmkv");
}

// A request names a listed model or none; any other name was answered
// silently by this one while /v1/models listed another (OpenAI: 404
// model_not_found).
TEST_F(ServerTest, AnUnlistedModelNameIsModelNotFound) {
  Running server(model_, small_options());
  auto c = server.client();
  const json body = chat_body("", "Hi", 2);
  EXPECT_EQ(c->Post("/v1/chat/completions", body.dump(), "application/json")->status, 200);
  for (const char* name : {"SmolLM2-135M-Instruct.F16.gguf", "swarmkv"}) {
    json named = body;
    named["model"] = name;
    EXPECT_EQ(c->Post("/v1/chat/completions", named.dump(), "application/json")->status, 200)
        << name;
  }
  json other = body;
  other["model"] = "gpt-4o";
  const auto res = c->Post("/v1/chat/completions", other.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "model_not_found");
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["message"],
            "model 'gpt-4o' is not served here: this server serves "
            "'SmolLM2-135M-Instruct.F16.gguf' (also called 'swarmkv'); GET /v1/models lists them");
}

TEST_F(ServerTest, EachBadRequestGetsItsStatusAndOpenAIsErrorShape) {
  ServerOptions o = small_options();
  o.max_body_bytes = 2048;
  o.context.n_ctx = 256;
  Running server(model_, o);
  auto c = server.client();
  const auto post = [&](const std::string& body) {
    return c->Post("/v1/chat/completions", body, "application/json");
  };
  auto res = post(R"({"messages": [)");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["param"], nullptr);
  EXPECT_EQ(e["message"].get<std::string>().rfind("body: not JSON", 0), 0u) << e;

  res = post(R"({"messages": [{"role": "user", "content": "x"}], "temperature": 9})");
  EXPECT_EQ(res->status, 400);
  e = json::parse(res->body)["error"];
  EXPECT_EQ(e["param"], "temperature");
  EXPECT_EQ(e["message"], "temperature: must be in [0, 2] (got 9)");

  res = post(chat_body("", std::string(3000, 'a'), 4).dump());
  EXPECT_EQ(res->status, 413);
  EXPECT_EQ(json::parse(res->body)["error"]["message"],
            "body: larger than 2048 bytes, the most this server takes");

  res = post(chat_body("", document(1200), 100).dump());
  EXPECT_EQ(res->status, 400);
  e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_NE(e["message"].get<std::string>().find("+ max_tokens 100 = "), std::string::npos) << e;
  EXPECT_NE(e["message"].get<std::string>().find("> n_ctx 256"), std::string::npos) << e;

  // n choices need n answers' room: refused, where it used to wait forever.
  json n_body = chat_body("", "Name a colour.", 125);
  n_body["n"] = 2;
  res = post(n_body.dump());
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_NE(e["message"].get<std::string>().find(" + n 2 x max_tokens 125 + 1 = "),
            std::string::npos)
      << e;
  EXPECT_NE(e["message"].get<std::string>().find("> n_ctx 256; shorten the messages or lower "
                                                 "max_tokens or n"),
            std::string::npos)
      << e;

  res = c->Get("/v1/nothing");
  EXPECT_EQ(res->status, 404);
  EXPECT_EQ(json::parse(res->body)["error"]["message"], "no route GET /v1/nothing");
}

// A POST body must be JSON, said so by its Content-Type (parameters
// allowed): a page on another site can send text/plain or a form to any
// server without asking first, never JSON. It was read as JSON whatever its
// type (and this httplib would parse a form body itself).
TEST_F(ServerTest, APostBodyMustSayItIsJson) {
  Running server(model_, small_options());
  auto c = server.client();
  const std::string body = chat_body("", "Name a colour.", 6).dump();
  const json as_json = post_chat(*c, json::parse(body));
  for (const char* type : {"application/json; charset=utf-8", "Application/JSON"}) {
    const auto res = c->Post("/v1/chat/completions", body, type);
    ASSERT_TRUE(res) << type;
    ASSERT_EQ(res->status, 200) << type << ": " << res->body;
    EXPECT_EQ(json::parse(res->body)["choices"][0]["message"]["content"],
              as_json["choices"][0]["message"]["content"])
        << type;
  }
  for (const char* type :
       {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"}) {
    for (const char* path : {"/v1/chat/completions", "/v1/pipelines"}) {
      const auto res = c->Post(path, body, type);
      ASSERT_TRUE(res) << type;
      EXPECT_EQ(res->status, 415) << type;
      const json e = json::parse(res->body)["error"];
      EXPECT_EQ(e["code"], "unsupported_media_type");
      EXPECT_EQ(e["message"], fmt::format("body: Content-Type '{}'; send the request as one JSON "
                                          "object with the header 'Content-Type: "
                                          "application/json'",
                                          type));
    }
  }
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_total"), 0) << "nothing posted ran";
}

// n completions of one prompt fork from the first: its prompt is
// prefilled once, each other choice decodes only the prompt's last token.
TEST_F(ServerTest, NCompletionsForkFromOnePrompt) {
  Running server(model_, small_options());
  auto c = server.client();
  json body = chat_body("", "Name a colour.", 12);
  body["n"] = 3;
  const json j = post_chat(*c, body);
  expect_completion_shape(j, 3);
  EXPECT_EQ(j["choices"][1]["message"]["content"], j["choices"][0]["message"]["content"]);
  EXPECT_EQ(j["choices"][2]["message"]["content"], j["choices"][0]["message"]["content"]);
  const int prompt = j["usage"]["prompt_tokens"];
  EXPECT_EQ(metric(*c, "swarmkv_prefilled_tokens_total"), prompt + 2);
  const Streamed s = post_stream(*c, body, 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.texts[static_cast<size_t>(i)], j["choices"][0]["message"]["content"]);
  }
  EXPECT_EQ(s.usage["completion_tokens"], j["usage"]["completion_tokens"]);
}

// logit_bias steers even greedy answers and min_p cuts a sampled one's
// choices; a token outside the vocabulary is a 400 naming it.
TEST_F(ServerTest, LogitBiasAndMinPAreApplied) {
  Running server(model_, small_options());
  auto c = server.client();
  const json greedy = chat_body("", "Name a colour.", 8);
  const std::string plain = post_chat(*c, greedy)["choices"][0]["message"]["content"];
  const std::vector<Token> first = model_->tokenize(plain, false, false);
  ASSERT_FALSE(first.empty());
  json banned = greedy;
  banned["logit_bias"] = {{std::to_string(first[0]), -100}};
  const std::string other = post_chat(*c, banned)["choices"][0]["message"]["content"];
  EXPECT_NE(other, plain);
  // min_p 1 keeps only the likeliest token: a hot sampled answer is greedy's.
  json min_p = greedy;
  min_p["temperature"] = 1.5;
  min_p["min_p"] = 1.0;
  EXPECT_EQ(post_chat(*c, min_p)["choices"][0]["message"]["content"], plain);
  json outside = greedy;
  outside["logit_bias"] = {{std::to_string(model_->n_vocab()), 5}};
  const auto res = c->Post("/v1/chat/completions", outside.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["message"],
            fmt::format("logit_bias: token {} is not in the model's vocabulary (ids 0 to {})",
                        model_->n_vocab(), model_->n_vocab() - 1));
}

// tool_choice "required" or a named function: the answer is a call, in
// OpenAI's tool_calls shape, whose arguments satisfy the function's schema;
// streamed, the same call in one delta. "auto" (the default): a call or
// text, the text as the message's content. A later turn reads the call and
// its result.
TEST_F(ServerTest, ToolChoiceMakesTheAnswerACallInOpenAIsShape) {
  Running server(model_, small_options());
  auto c = server.client();
  json body = chat_body("", "What is the weather in Oslo? Use a tool.", 64);
  body["n"] = 2;
  body["tools"] = json::parse(R"([
      {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
       "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
       "unit": {"enum": ["C", "F"]}}, "required": ["city", "unit"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
       "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"],
       "additionalProperties": false}}}])");
  body["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const json j = post_chat(*c, body);
  ASSERT_EQ(j["choices"].size(), 2u);
  for (const json& choice : j["choices"]) {
    EXPECT_EQ(choice["finish_reason"], "tool_calls") << choice;
    EXPECT_TRUE(choice["message"]["content"].is_null()) << choice;
    ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << choice;
    const json& call = choice["message"]["tool_calls"][0];
    EXPECT_EQ(call["type"], "function");
    EXPECT_FALSE(call["id"].get<std::string>().empty());
    EXPECT_EQ(call["function"]["name"], "get_weather");
    const json args = json::parse(call["function"]["arguments"].get<std::string>());
    ASSERT_TRUE(args.is_object()) << args;
    EXPECT_EQ(args.size(), 2u) << args;
    EXPECT_TRUE(args["city"].is_string()) << args;
    EXPECT_LE(args["city"].get<std::string>().size(), 20u) << args;
    EXPECT_TRUE(args["unit"] == "C" || args["unit"] == "F") << args;
  }
  const json first = j["choices"][0]["message"]["tool_calls"][0];
  EXPECT_NE(first["id"], j["choices"][1]["message"]["tool_calls"][0]["id"]);

  const Streamed st = post_stream(*c, body, 2);
  EXPECT_EQ(st.status, 200);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(st.finish[i], "tool_calls");
    EXPECT_EQ(st.texts[i], "");
    ASSERT_EQ(st.tool_calls[i].size(), 1u);
    EXPECT_EQ(st.tool_calls[i][0]["index"], 0);
    EXPECT_EQ(st.tool_calls[i][0]["function"], first["function"]);
  }

  // "required" offers both; the answer calls one of them.
  body["tool_choice"] = "required";
  body["n"] = 1;
  const json any = post_chat(*c, body)["choices"][0];
  EXPECT_EQ(any["finish_reason"], "tool_calls");
  const std::string name = any["message"]["tool_calls"][0]["function"]["name"];
  EXPECT_TRUE(name == "get_weather" || name == "get_time") << name;

  // "auto" (no tool_choice): a call, or text ({"response": ...}) given as
  // the message's content with finish_reason "stop"; streamed the same.
  json automatic = body;
  automatic.erase("tool_choice");
  int calls = 0;
  int texts = 0;
  for (const char* ask : {"What is the weather in Oslo?", "Write one short sentence about cats.",
                          "Reply in words: say hello, no tool."}) {
    automatic["messages"] = json::array({{{"role", "user"}, {"content", ask}}});
    const json a = post_chat(*c, automatic)["choices"][0];
    const Streamed sa = post_stream(*c, automatic, 1);
    if (a["finish_reason"] == "tool_calls") {
      ++calls;
      const std::string called = a["message"]["tool_calls"][0]["function"]["name"];
      EXPECT_TRUE(called == "get_weather" || called == "get_time") << a;
      EXPECT_TRUE(a["message"]["content"].is_null()) << a;
      ASSERT_EQ(sa.tool_calls[0].size(), 1u) << ask;
      EXPECT_EQ(sa.tool_calls[0][0]["function"], a["message"]["tool_calls"][0]["function"]);
    } else {
      ++texts;
      EXPECT_EQ(a["finish_reason"], "stop") << a;
      EXPECT_FALSE(a["message"].contains("tool_calls")) << a;
      ASSERT_TRUE(a["message"]["content"].is_string()) << a;
      EXPECT_EQ(a["message"]["content"].get<std::string>().find("\"response\""), std::string::npos)
          << "the envelope leaked: " << a;
      EXPECT_EQ(sa.texts[0], a["message"]["content"]) << ask;
      EXPECT_TRUE(sa.tool_calls[0].empty()) << ask;
    }
    EXPECT_EQ(sa.finish[0], a["finish_reason"]) << ask;
  }
  EXPECT_EQ(calls + texts, 3);
  // The text branch, made certain (SmolLM2 calls a tool for every question
  // above): the call's key is banned, so the envelope's is the way on.
  for (const std::string& key : {std::string("name"), std::string("\"name")}) {
    const std::vector<Token> ids = model_->tokenize(key, false, false);
    if (ids.size() == 1) automatic["logit_bias"][std::to_string(ids[0])] = -100;
  }
  ASSERT_TRUE(automatic.contains("logit_bias")) << "no one-token key to ban";
  automatic["messages"] = json::array({{{"role", "user"}, {"content", "Say hello."}}});
  const json said = post_chat(*c, automatic)["choices"][0];
  EXPECT_EQ(said["finish_reason"], "stop") << said;
  ASSERT_TRUE(said["message"]["content"].is_string()) << said;
  EXPECT_FALSE(said["message"].contains("tool_calls")) << said;
  const Streamed st_said = post_stream(*c, automatic, 1);
  EXPECT_EQ(st_said.texts[0], said["message"]["content"]);
  EXPECT_EQ(st_said.finish[0], "stop");

  // Cut by max_tokens inside the call: text, "length", no tool_calls.
  body["max_tokens"] = 3;
  const json cut = post_chat(*c, body)["choices"][0];
  EXPECT_EQ(cut["finish_reason"], "length");
  EXPECT_FALSE(cut["message"].contains("tool_calls"));
  EXPECT_EQ(cut["message"]["content"].get<std::string>().rfind("{", 0), 0u) << cut;

  // The next turn: the call and its result in the history, a text answer.
  json turn = chat_body("", "What is the weather in Oslo? Use a tool.", 16);
  turn["messages"].push_back(
      {{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({first})}});
  turn["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", first["id"]}, {"content", "-3 C, snow"}});
  turn["tools"] = body["tools"];
  turn["tool_choice"] = "none";
  const json reply = post_chat(*c, turn)["choices"][0];
  EXPECT_NE(reply["finish_reason"], "tool_calls");
  EXPECT_TRUE(reply["message"]["content"].is_string());
}

// With room for one completion, a second request waits in the queue and
// runs as soon as the first has finished: the step that finishes the last
// live completion must not leave the engine asleep with a request queued.
TEST_F(ServerTest, AQueuedRequestRunsWhenTheLastLiveOneFinishes) {
  ServerOptions o = small_options();
  o.max_live = 1;
  o.max_cached = 1;
  Running server(model_, o);
  std::vector<std::future<int>> statuses;
  for (const char* q : {"Name a colour.", "Name a fruit.", "Name a city."}) {
    statuses.push_back(std::async(std::launch::async, [&server, q] {
      auto c = server.client();
      c->set_read_timeout(60, 0);  // a request left asleep fails here, not at CTest's timeout
      const auto res =
          c->Post("/v1/chat/completions", chat_body("", q, 8).dump(), "application/json");
      return res ? res->status : -1;
    }));
  }
  for (auto& f : statuses) EXPECT_EQ(f.get(), 200);
}

// A stop string ends the answer before it, streamed or not, and no byte of
// it is streamed.
TEST_F(ServerTest, StopStringsEndTheAnswerAndAreNeverStreamed) {
  Running server(model_, small_options());
  auto c = server.client();
  const json plain = post_chat(*c, chat_body("", "Describe the sea in two sentences.", 40));
  const std::string full = plain["choices"][0]["message"]["content"];
  ASSERT_GT(full.size(), 20u) << full;
  const std::string stop = full.substr(full.size() / 2, 4);
  const std::string expected = full.substr(0, full.find(stop));
  json body = chat_body("", "Describe the sea in two sentences.", 40);
  body["stop"] = json::array({stop, "never-in-it"});
  const json j = post_chat(*c, body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], expected);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const Streamed s = post_stream(*c, body);
  EXPECT_EQ(s.texts[0], expected);
  EXPECT_EQ(s.finish[0], "stop");
}

// A prompt the model answers at length, for the tests that need a request
// still running a while later.
json long_answer_body(int max_tokens) {
  return chat_body("", "Write a long story about a cat.", max_tokens);
}

TEST_F(ServerTest, AClientThatDisconnectsMidStreamFreesItsSequence) {
  Running server(model_, small_options());
  auto c = server.client();
  json body = long_answer_body(2000);
  body["stream"] = true;
  int chunks = 0;
  const auto res = post_receiving(*c, body, [&](const char*, size_t) { return ++chunks < 4; });
  EXPECT_FALSE(res);  // we hung up
  auto m = server.client();
  EXPECT_TRUE(await_metric(*m, "swarmkv_live_sequences", 0));
  EXPECT_EQ(metric(*m, "swarmkv_cancelled_total"), 1);
  EXPECT_LT(metric(*m, "swarmkv_completion_tokens_total"), 2000);
  EXPECT_EQ(metric(*m, "swarmkv_requests_in_flight"), 0);
}

// A streamed request writes nothing while its prompt is prefilled: a client
// that hangs up then stops the prefill, not only the answer (httplib's
// is_writable sees the closed connection).
TEST_F(ServerTest, AClientThatHangsUpDuringThePrefillStopsIt) {
  Running server(model_, small_options());
  auto c = server.client();
  json body = chat_body("", document(10000) + "\n\nWhat is this?", 8);
  body["stream"] = true;
  const auto res = post_receiving(*c, body, [](const char*, size_t) { return false; });
  EXPECT_FALSE(res);  // hung up at the first chunk, the role's
  c.reset();
  auto m = server.client();
  EXPECT_TRUE(await_metric(*m, "swarmkv_cancelled_total", 1));
  EXPECT_TRUE(await_metric(*m, "swarmkv_live_sequences", 0));
  EXPECT_LT(metric(*m, "swarmkv_prefilled_tokens_total"), 1500)
      << "of " << metric(*m, "swarmkv_prompt_tokens_total");
}

json one_agent_pipeline(int max_tokens, const std::string& prompt = "Who is the Licensor?") {
  return {
      {"document", {{"text", document(600)}}},
      {"agents", json::array({{{"name", "a"}, {"prompt", prompt}, {"max_tokens", max_tokens}}})}};
}

// A web page must not drive the server. DNS rebinding: a page whose own
// name was pointed at 127.0.0.1 reads the server as same-origin, but its
// requests carry that name as their Host; 403 on every route but /health.
// CSRF: a page elsewhere POSTs with its Origin; 403. The server's own
// names and origin, and clients that send no Origin, are answered; the
// allow lists widen the rules. (Neither header was looked at.)
TEST_F(ServerTest, AForeignHostOrOriginIsRefusedAndTheServersOwnAnswered) {
  ServerOptions o = small_options();
  o.allow_hosts = {"proxy.example"};
  o.allow_origins = {"https://app.example"};
  Running server(model_, o);
  auto c = server.client();
  const std::string port = std::to_string(server.port());
  const std::string chat = chat_body("", "Hi", 1).dump();
  const auto code = [](const httplib::Result& res) {
    return res && res->status == 403 ? json::parse(res->body)["error"]["code"].get<std::string>()
                                     : std::to_string(res ? res->status : 0);
  };
  for (const char* path : {"/", "/runs/1", "/v1/pipelines/1", "/v1/models", "/metrics"}) {
    EXPECT_EQ(code(c->Get(path, {{"Host", "evil.example:" + port}})), "forbidden_host") << path;
  }
  EXPECT_EQ(
      code(c->Post("/v1/chat/completions", {{"Host", "evil.example"}}, chat, "application/json")),
      "forbidden_host");
  EXPECT_EQ(c->Get("/health", {{"Host", "evil.example"}})->status, 200) << "/health tells nothing";
  for (const std::string& origin :
       std::vector<std::string>{"http://evil.example", "null", "http://localhost:" + port}) {
    EXPECT_EQ(code(c->Post("/v1/pipelines", {{"Origin", origin}}, one_agent_pipeline(1).dump(),
                           "application/json")),
              "forbidden_origin")
        << origin;
  }
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_total"), 0) << "nothing posted ran";
  for (const httplib::Headers& own :
       {httplib::Headers{}, httplib::Headers{{"Origin", "http://127.0.0.1:" + port}},
        httplib::Headers{{"Host", "localhost:" + port}, {"Origin", "http://localhost:" + port}},
        httplib::Headers{{"Host", "proxy.example"}},
        httplib::Headers{{"Origin", "https://app.example"}}}) {
    const auto res = c->Post("/v1/chat/completions", own, chat, "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
  }
}

// A body as Python's json writes it: characters outside the BMP as
// surrogate pairs, which come back as themselves in the result.
TEST_F(ServerTest, APostedPipelineKeepsCharactersOutsideTheBmp) {
  Running server(model_, small_options());
  auto c = server.client();
  const std::string body = R"({"document": {"text": "A licence \ud83d\udcc4 for everyone."},
    "agents": [{"name": "a\ud83c\udf89", "prompt": "Repeat: \ud83d\ude00", "max_tokens": 2}]})";
  const auto res = c->Post("/v1/pipelines?stream=false", body, "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const json result = json::parse(res->body);
  ASSERT_EQ(result["agents"].size(), 1u) << res->body;
  EXPECT_EQ(result["agents"][0]["name"], "a\U0001F389");
  EXPECT_EQ(result["agents"][0]["status"], "ok") << res->body;
}

// A posted corpus: each document's outcome as it ends ("document_done",
// its index in the corpus), then the corpus's result, every answer (the
// reduce agent's too) the same corpus's run in process; its view and page
// are the corpus's. A document over the server's context limit is refused
// by name before anything runs.
TEST_F(ServerTest, APostedCorpusStreamsEachDocumentAndAnswersAsTheSameRunInProcess) {
  const json body = {
      {"name", "two"},
      {"exact", false},
      {"documents", json::array({{{"name", "one.txt"}, {"text", document(300)}},
                                 {{"name", "two.txt"}, {"text", "A short note about a loan."}}})},
      {"defaults", {{"max_tokens", 8}}},
      {"agents",
       json::array({{{"name", "who"}, {"prompt", "Who is named?"}},
                    {{"name", "sum"}, {"scope", "corpus"}, {"prompt", "Compare:\n{{who[*]}}"}}})}};
  const CorpusResult local =
      run_corpus(parse_corpus_json(read_pipeline_json(body.dump(), "test"), "test", ""), model_);
  ASSERT_TRUE(local.ok());
  ServerOptions options = small_options();
  options.max_pipeline_ctx = 1024;
  Running server(model_, options);
  auto c = server.client();
  std::string id;
  const PipelineStream stream = post_pipeline(*c, body, {}, &id);
  ASSERT_EQ(stream.status, 200);
  ASSERT_EQ(stream.events.size(), 3u);
  for (size_t i = 0; i < 2; ++i) {
    const PipelineEvent& e = stream.events[i];
    EXPECT_EQ(e.name, "document_done");
    EXPECT_EQ(e.data["index"], i);
    EXPECT_EQ(e.data["name"], local.documents[i].name);
    EXPECT_TRUE(e.data["ok"].get<bool>()) << e.data;
  }
  ASSERT_EQ(stream.events[2].name, "result");
  const json& result = stream.events[2].data;
  EXPECT_EQ(result["kind"], "corpus");
  EXPECT_TRUE(result["ok"].get<bool>()) << result;
  EXPECT_EQ(result["model"], std::filesystem::path(model_->path()).filename().string())
      << "no server path";
  ASSERT_EQ(result["documents"].size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const json& agents = result["documents"][i]["result"]["agents"];
    ASSERT_EQ(agents.size(), 1u);
    EXPECT_EQ(agents[0]["tokens"], json(local.documents[i].result->agents[0].tokens)) << i;
    EXPECT_EQ(stream.events[i].data["result"]["agents"][0]["tokens"], agents[0]["tokens"]);
  }
  ASSERT_TRUE(local.reduce);
  EXPECT_EQ(result["reduce"]["agents"][0]["tokens"], json(local.reduce->agents[0].tokens));
  EXPECT_EQ(result["reduce"]["agents"][0]["prompt_rendered"],
            local.reduce->agents[0].prompt_rendered);

  const auto view = c->Get("/v1/pipelines/" + id);
  ASSERT_TRUE(view);
  ASSERT_EQ(view->status, 200);
  json viewed = json::parse(view->body);
  EXPECT_EQ(viewed["state"], "ok");
  viewed.erase("state");
  EXPECT_EQ(viewed, result);
  const auto page = c->Get("/runs/" + id);
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  for (const char* text : {"two — 2 documents", "one.txt", "two.txt", "Over every document"}) {
    EXPECT_NE(page->body.find(text), std::string::npos) << text;
  }

  json too_long = body;
  too_long["documents"][1] = {{"name", "long.txt"}, {"text", document(6000)}};
  const auto refused = c->Post("/v1/pipelines", too_long.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  const json e = json::parse(refused->body)["error"];
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_EQ(e["message"].get<std::string>().rfind("document 'long.txt': pipeline: needs n_ctx ", 0),
            0u)
      << e;
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_total"), 1) << "the refused corpus never ran";
}

// A client that hangs up after a corpus's first document: every document
// left fails at once as aborted (none is prefilled for nothing), the reduce
// agent with them, and the run counts as cancelled.
TEST_F(ServerTest, AHangUpMidCorpusFailsEveryDocumentLeftAtOnce) {
  json body = {
      {"exact", false},
      {"documents", json::array()},
      {"defaults", {{"max_tokens", 4}}},
      {"agents",
       json::array({{{"name", "who"}, {"prompt", "Who is named?"}},
                    {{"name", "sum"}, {"scope", "corpus"}, {"prompt", "Compare:\n{{who[*]}}"}}})}};
  for (int i = 0; i < 6; ++i)
    body["documents"].push_back({{"name", fmt::format("d{}.txt", i)}, {"text", document(2000)}});
  Running server(model_, small_options());
  auto c = server.client();
  std::string id;
  const PipelineStream stream = post_pipeline(
      *c, body, [](const PipelineEvent& e) { return e.name != "document_done"; }, &id);
  ASSERT_FALSE(stream.events.empty());
  EXPECT_EQ(stream.events.back().name, "document_done");
  ASSERT_TRUE(await_metric(*c, "swarmkv_pipelines_running", 0));
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_cancelled_total"), 1);
  const auto view = c->Get("/v1/pipelines/" + id);
  ASSERT_TRUE(view);
  const json result = json::parse(view->body);
  EXPECT_EQ(result["state"], "failed");
  ASSERT_EQ(result["documents"].size(), 6u);
  size_t aborted = 0;
  for (const json& d : result["documents"]) {
    if (d["error"].is_object() && d["error"]["code"] == "aborted") {
      ++aborted;
      EXPECT_TRUE(d["result"].is_null()) << "not prefilled for nothing: " << d["name"];
    }
  }
  EXPECT_GE(aborted, 4u) << "every document after the one running at the hang-up" << result;
  EXPECT_EQ(result["reduce"]["agents"][0]["status"], "dependency_failed") << result["reduce"];
}

TEST_F(ServerTest, APostedPipelineIsRefusedWithItsReason) {
  ServerOptions options = small_options();
  options.max_pipeline_ctx = 128;
  Running server(model_, options);
  auto c = server.client();
  const auto refused = [&](const json& body, int status) {
    const auto res = c->Post("/v1/pipelines", body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return json();
    EXPECT_EQ(res->status, status) << res->body;
    EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
    return json::parse(res->body)["error"];
  };
  json named = one_agent_pipeline(8);
  named["model"] = "/etc/hostname";
  json e = refused(named, 400);
  EXPECT_EQ(e["param"], "model");
  EXPECT_EQ(e["type"], "invalid_request_error");
  json file = one_agent_pipeline(8);
  file["document"] = {{"file", "/etc/hostname"}};
  EXPECT_EQ(refused(file, 400)["param"], "document.file");
  json cycle = one_agent_pipeline(8);
  cycle["agents"] = json::array({{{"name", "a"}, {"prompt", "x"}, {"depends_on", "b"}},
                                 {{"name", "b"}, {"prompt", "y"}, {"depends_on", "a"}}});
  EXPECT_EQ(refused(cycle, 400)["code"], "graph");
  e = refused(one_agent_pipeline(8), 400);
  EXPECT_EQ(e["code"], "context_length_exceeded");
  const std::string message = e["message"];
  EXPECT_EQ(message.rfind("pipeline: needs n_ctx ", 0), 0u) << message;
  EXPECT_NE(message.find(", more than the 128 this server allows (--max-pipeline-ctx)"),
            std::string::npos)
      << message;
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_total"), 0);
}

// A posted pipeline runs on the server's threads (serve -t), not on every
// core, and cannot ask for more: it ran on all of them, or on whatever its
// `threads` said. Fewer are its own business.
TEST_F(ServerTest, APostedPipelineRunsOnTheServersThreadsAndCannotRaiseThem) {
  if (hardware_threads() < 2) GTEST_SKIP() << "needs 2 hardware threads to ask for more than 1";
  ServerOptions options = small_options();
  options.context.n_threads = 1;
  Running server(model_, options);
  auto c = server.client();
  const auto post = [&](const json& body) {
    return c->Post("/v1/pipelines?stream=false", body.dump(), "application/json");
  };
  for (const json& threads : {json(nullptr), json(0), json(1)}) {
    json body = one_agent_pipeline(2);
    if (!threads.is_null()) body["threads"] = threads;
    const auto res = post(body);
    ASSERT_TRUE(res);
    ASSERT_EQ(res->status, 200) << res->body;
    const json engine = json::parse(res->body)["engine"];
    EXPECT_EQ(engine["threads"], 1) << threads;
    EXPECT_EQ(engine["threads_batch"], 1) << threads;
  }
  for (const char* key : {"threads", "threads_batch"}) {
    json body = one_agent_pipeline(2);
    body[key] = 2;
    const auto res = post(body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << key << ": " << res->body;
    const json e = json::parse(res->body)["error"];
    EXPECT_EQ(e["param"], key);
    EXPECT_EQ(e["message"], fmt::format("{}: 2 threads, more than the 1 this server runs with "
                                        "(serve -t/--threads); leave '{}' out to run on the "
                                        "server's",
                                        key, key));
  }
}

// One pipeline at a time (the default): a second gets 429 while the first
// runs; hanging up on the first fails its agent at its next token, which
// frees the slot for the next pipeline, whose result alone comes back with
// ?stream=false.
TEST_F(ServerTest, ABusyPipelineSlotAnswers429AndAHangUpCancelsTheRun) {
  Running server(model_, small_options());
  auto c = server.client();
  std::promise<void> generating;
  std::atomic<bool> hang_up{false};
  std::thread first([&] {
    auto own = server.client();
    bool told = false;
    post_pipeline(*own, one_agent_pipeline(2000, "Write a long story about a cat."),
                  [&](const PipelineEvent& e) {
                    if (e.name == "token" && !told) {
                      told = true;
                      generating.set_value();
                    }
                    return !hang_up.load();
                  });
  });
  const bool ready = generating.get_future().wait_for(300s) == std::future_status::ready;
  EXPECT_TRUE(ready) << "the first pipeline never generated";
  if (ready) {
    const auto res = c->Post("/v1/pipelines", one_agent_pipeline(4).dump(), "application/json");
    EXPECT_TRUE(res);
    if (res) {
      EXPECT_EQ(res->status, 429) << res->body;
      EXPECT_EQ(res->get_header_value("Retry-After"), "1");
      EXPECT_EQ(json::parse(res->body)["error"]["message"],
                "1 pipeline is running, the most this server runs at once (--max-pipelines); "
                "retry later");
    }
    // A full slot answers before the pipeline is prepared: one whose budget
    // would be refused (400) gets 429 too while the slot is taken.
    json too_big = one_agent_pipeline(4);
    too_big["n_ctx"] = 64;
    const auto busy = c->Post("/v1/pipelines", too_big.dump(), "application/json");
    EXPECT_TRUE(busy);
    if (busy) {
      EXPECT_EQ(busy->status, 429) << busy->body;
    }
  }
  hang_up.store(true);
  first.join();
  EXPECT_TRUE(await_metric(*c, "swarmkv_pipelines_running", 0));
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_cancelled_total"), 1);
  json too_big = one_agent_pipeline(4);
  too_big["n_ctx"] = 64;
  const auto refused = c->Post("/v1/pipelines", too_big.dump(), "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  const auto res =
      c->Post("/v1/pipelines?stream=false", one_agent_pipeline(4).dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
  const json result = json::parse(res->body);
  EXPECT_TRUE(result["ok"].get<bool>()) << res->body;
  EXPECT_EQ(result["schema_version"], kResultSchemaVersion);
  EXPECT_LE(result["agents"][0]["n_tokens"].get<int>(), 4);
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_total"), 2);
  EXPECT_EQ(metric(*c, "swarmkv_requests_in_flight"), 0);
}

// A posted run is listed at / and followed at /runs/<id> (a page) and
// /v1/pipelines/<id> (its result so far) while it runs, behind the key:
// a Bearer token, or Basic auth with the key as the password (what a
// browser sends once asked). After it ends its view is its result; only
// the last keep_runs stay.
TEST_F(ServerTest, PostedRunsAreListedAndFollowedBehindTheKey) {
  ServerOptions o = small_options();
  o.api_key = "k3y";
  o.keep_runs = 2;
  Running server(model_, o);
  auto c = server.client("k3y");
  httplib::Client browser("127.0.0.1", server.port());
  browser.set_read_timeout(60, 0);
  browser.set_basic_auth("anyone", "k3y");

  json mid_view;
  std::string mid_page;
  std::string id;  // the POST's X-SwarmKV-Run-Id
  const PipelineStream st = post_pipeline(
      *c, one_agent_pipeline(12),
      [&](const PipelineEvent& e) {
        if (e.name == "token" && mid_view.is_null()) {
          const auto v = browser.Get("/v1/pipelines/" + id);
          const auto p = browser.Get("/runs/" + id);
          EXPECT_TRUE(v && p);
          if (v && p) {
            EXPECT_EQ(v->status, 200) << v->body;
            EXPECT_EQ(p->status, 200) << p->body;
            mid_view = json::parse(v->body);
            mid_page = p->body;
          }
        }
        return true;
      },
      &id);
  ASSERT_EQ(st.status, 200);
  // 128 random bits: not to be guessed from another run's id.
  EXPECT_TRUE(is_run_id(id)) << id;
  ASSERT_EQ(st.events.back().name, "result");
  const json& result = st.events.back().data;
  ASSERT_TRUE(mid_view.is_object()) << "no token event came";
  EXPECT_EQ(mid_view["live"]["state"], "running");
  EXPECT_EQ(mid_view["agents"][0]["status"], "running");
  EXPECT_GE(mid_view["agents"][0]["n_tokens"].get<int>(), 1) << "the view has the token already";
  EXPECT_NE(mid_page.find("<meta http-equiv=\"refresh\" content=\"1\">"), std::string::npos);
  EXPECT_NE(mid_page.find("<g class=\"node running\">"), std::string::npos);

  auto ended = browser.Get("/v1/pipelines/" + id);
  ASSERT_TRUE(ended);
  json view = json::parse(ended->body);
  EXPECT_EQ(view["live"]["state"], "ok");
  view.erase("live");
  EXPECT_EQ(view, result) << "once it ended, its view is its result";
  auto page = browser.Get("/runs/" + id);
  ASSERT_TRUE(page);
  EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
  EXPECT_EQ(page->body.find("http-equiv=\"refresh\""), std::string::npos) << "it ended: no reload";
  EXPECT_NE(page->body.find("<a href=\"#agent-0\" id=\"bar-0\">"), std::string::npos);
  EXPECT_NE(page->body.find("run " + id + " on this server"), std::string::npos);

  // The key, or nothing.
  httplib::Client anon("127.0.0.1", server.port());
  const auto no_key = anon.Get("/runs/" + id);
  ASSERT_TRUE(no_key);
  EXPECT_EQ(no_key->status, 401);
  EXPECT_EQ(no_key->get_header_value("WWW-Authenticate"),
            R"(Basic realm="swarmkv", charset="UTF-8")");
  EXPECT_NE(no_key->body.find("any user name and the key as the password"), std::string::npos);
  const auto api = anon.Get("/v1/models");
  ASSERT_TRUE(api);
  EXPECT_EQ(api->status, 401);
  EXPECT_EQ(api->get_header_value("WWW-Authenticate"), R"(Bearer realm="swarmkv")");
  // base64 of "anyone:wrong", of "k3y" (no colon), not base64, no scheme.
  for (const char* header :
       {"Basic YW55b25lOndyb25n", "Basic azN5", "Basic !!!!", "Basic k3y", "k3y"}) {
    const auto res = anon.Get("/runs/" + id, {{"Authorization", header}});
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 401) << header;
  }
  const auto no_user = anon.Get("/runs/" + id, {{"Authorization", "basic OmszeQ=="}});  // ":k3y"
  ASSERT_TRUE(no_user);
  EXPECT_EQ(no_user->status, 200) << "any user name, none too; the scheme in any case";
  const auto bearer = c->Get("/runs/" + id);
  ASSERT_TRUE(bearer);
  EXPECT_EQ(bearer->status, 200) << "a page takes the Bearer token too";
  const auto models = browser.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200) << "and the API Basic auth";

  // Two more runs: the first leaves the list.
  std::vector<std::string> ids = {id};
  for (int i = 0; i < 2; ++i) {
    const auto res =
        c->Post("/v1/pipelines?stream=false", one_agent_pipeline(2).dump(), "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200) << res->body;
    ids.push_back(res->get_header_value("X-SwarmKV-Run-Id"));
    EXPECT_TRUE(is_run_id(ids.back())) << ids.back();
  }
  EXPECT_TRUE(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2]);
  const auto gone = browser.Get("/runs/" + id);
  ASSERT_TRUE(gone);
  EXPECT_EQ(gone->status, 404);
  EXPECT_EQ(json::parse(gone->body)["error"]["message"],
            fmt::format("no run '{}' here: this server keeps its last 2 pipeline runs "
                        "(--keep-runs), and GET / lists them",
                        id));
  const auto list = browser.Get("/");
  ASSERT_TRUE(list);
  EXPECT_EQ(list->status, 200);
  const auto row = [&](const std::string& run) { return list->body.find("<tr id=\"run-" + run); };
  EXPECT_NE(row(ids[2]), std::string::npos) << list->body;
  EXPECT_NE(row(ids[1]), std::string::npos);
  EXPECT_EQ(row(ids[0]), std::string::npos);
  EXPECT_LT(row(ids[2]), row(ids[1])) << "newest first";
  const auto metrics = c->Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(
      metrics->body.find("swarmkv_http_responses_total{route=\"/runs/{id}\",status=\"404\"} 1"),
      std::string::npos);
}

// A posted pipeline uses a snapshot store as `swarmkv run` does: the first
// run prefills the document and publishes it, the second restores it and
// answers the same; the result names no server path. The store is posted
// runs' own (<store>/posted), so that clients cannot evict the operator's
// entries, and its files are the owner's only.
TEST_F(ServerTest, APostedPipelineRestoresItsDocumentFromTheStoreTheSecondTime) {
  const TempStore dir("store");
  const ServerOptions options = store_options(SnapshotCacheMode::kOn, dir);
  Running server(model_, options);
  auto c = server.client();
  const auto run = [&] {
    const auto res =
        c->Post("/v1/pipelines?stream=false", one_agent_pipeline(8).dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return json();
    EXPECT_EQ(res->status, 200) << res->body;
    return json::parse(res->body);
  };
  const json cold = run();
  const json warm = run();
  ASSERT_TRUE(cold.is_object() && warm.is_object());
  EXPECT_EQ(cold["snapshot"]["source"], "prefill");
  EXPECT_TRUE(cold["snapshot"]["published"].get<bool>());
  EXPECT_EQ(cold["snapshot"]["path"], "");
  EXPECT_EQ(warm["snapshot"]["source"], "cache");
  EXPECT_EQ(warm["snapshot"]["reused_tokens"], cold["prefix_tokens"]);
  EXPECT_EQ(warm["snapshot"]["prefilled_tokens"], 0);
  EXPECT_EQ(warm["snapshot"]["path"], "");
  EXPECT_EQ(warm["agents"][0]["answer"], cold["agents"][0]["answer"]);
  // In posted runs' own store, not the operator's, readable by its owner
  // only.
  const auto entries = [](const std::filesystem::path& folder) {
    std::vector<std::filesystem::path> out;
    for (const auto& e : std::filesystem::directory_iterator(folder)) {
      if (e.path().extension() == ".swkv") out.push_back(e.path());
    }
    return out;
  };
  EXPECT_TRUE(entries(dir.path).empty());
  const auto posted = entries(dir.path / "posted");
  ASSERT_EQ(posted.size(), 1u);
  EXPECT_EQ(std::filesystem::status(posted[0]).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
}

// A streamed long answer held open (its client reading) until destroyed.
class HeldStream {
 public:
  explicit HeldStream(const Running& server) : client_(server.client()) {
    thread_ = std::thread([this] {
      json body = long_answer_body(2000);
      body["stream"] = true;
      (void)post_receiving(*client_, body, [this](const char*, size_t) {
        streaming_.store(true);
        return !hang_up_.load();
      });
    });
    for (int i = 0; i < 400 && !streaming_.load(); ++i) std::this_thread::sleep_for(50ms);
  }
  ~HeldStream() {
    hang_up_.store(true);
    thread_.join();
  }
  HeldStream(const HeldStream&) = delete;
  HeldStream& operator=(const HeldStream&) = delete;
  bool streaming() const { return streaming_.load(); }

 private:
  std::unique_ptr<httplib::Client> client_;
  std::atomic<bool> streaming_{false};
  std::atomic<bool> hang_up_{false};
  std::thread thread_;
};

// A 429 with Retry-After and `message`; once the request in flight is gone,
// the server takes requests again.
void expect_429_then_room(const httplib::Result& res, httplib::Client& c,
                          const std::string& message) {
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429) << res->body;
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  const json e = json::parse(res->body)["error"];
  EXPECT_EQ(e["code"], "rate_limit_exceeded");
  EXPECT_EQ(e["message"], message);
  EXPECT_TRUE(await_metric(c, "swarmkv_requests_in_flight", 0));
  EXPECT_EQ(
      c.Post("/v1/chat/completions", chat_body("", "Hi", 2).dump(), "application/json")->status,
      200);
}

TEST_F(ServerTest, AFullServerAnswers429WithRetryAfter) {
  ServerOptions o = small_options();
  o.max_concurrent = 1;
  Running server(model_, o);
  auto second = server.client();
  const auto res = [&] {
    const HeldStream first(server);
    EXPECT_TRUE(first.streaming());
    return second->Post("/v1/chat/completions", chat_body("", "Hi", 2).dump(), "application/json");
  }();
  expect_429_then_room(
      res, *second,
      "1 requests are in flight, the most this server takes (--max-concurrent); retry later");
}

// One client address has only its share of the requests in flight, so
// that it cannot take them all (the connection layer shares the
// connections the same way: http_server_test).
TEST_F(ServerTest, OneClientHasOnlyItsShareOfTheRequestsInFlight) {
  ServerOptions o = small_options();
  o.max_concurrent = 8;
  o.max_concurrent_per_client = 1;
  Running server(model_, o);
  auto second = server.client();
  const auto res = [&] {
    const HeldStream first(server);
    EXPECT_TRUE(first.streaming());
    return second->Post("/v1/chat/completions", chat_body("", "Hi", 2).dump(), "application/json");
  }();
  expect_429_then_room(res, *second,
                       "1 requests from 127.0.0.1 are in flight, the most one client may have "
                       "(--max-concurrent-per-client); retry later");
}

// A client that hangs up before a whole (not streamed) answer is written
// cancels its work, as a streaming one does: a chat completion frees its
// sequence, a ?stream=false pipeline its slot (it held the only one).
TEST_F(ServerTest, AClientThatHangsUpOnAWholeAnswerCancelsIt) {
  Running server(model_, small_options());
  auto m = server.client();
  {
    auto c = server.client();
    c->set_read_timeout(1, 0);  // then httplib closes the connection
    EXPECT_FALSE(
        c->Post("/v1/chat/completions", long_answer_body(2000).dump(), "application/json"));
  }
  EXPECT_TRUE(await_metric(*m, "swarmkv_cancelled_total", 1));
  EXPECT_TRUE(await_metric(*m, "swarmkv_live_sequences", 0));
  EXPECT_LT(metric(*m, "swarmkv_completion_tokens_total"), 2000);
  {
    auto c = server.client();
    c->set_read_timeout(2, 0);
    EXPECT_FALSE(c->Post("/v1/pipelines?stream=false",
                         one_agent_pipeline(2000, "Write a long story about a cat.").dump(),
                         "application/json"));
  }
  EXPECT_TRUE(await_metric(*m, "swarmkv_pipelines_running", 0));
  EXPECT_EQ(metric(*m, "swarmkv_pipelines_cancelled_total"), 1);
  EXPECT_EQ(metric(*m, "swarmkv_http_responses_total{route=\"/v1/pipelines\",status=\"499\"}"), 1);
}

// A pipeline stopped by a client that left during its prefill counts as
// cancelled (it counted only runs in which a cancel failed an agent).
TEST_F(ServerTest, APipelineCancelledInItsPrefillIsCounted) {
  Running server(model_, small_options());
  auto c = server.client();
  json pipeline = one_agent_pipeline(8);
  pipeline["document"]["text"] = document(20000);
  post_pipeline(*c, pipeline, [](const PipelineEvent& e) { return e.name != "prefill"; });
  EXPECT_TRUE(await_metric(*c, "swarmkv_pipelines_running", 0));
  EXPECT_EQ(metric(*c, "swarmkv_pipelines_cancelled_total"), 1);
}

// Finished sequences kept for reuse stay within --max-cached even when few
// completions are live (the slots are max_live + max_cached).
TEST_F(ServerTest, CachedSequencesStayWithinMaxCached) {
  ServerOptions o = small_options();
  o.max_cached = 2;
  Running server(model_, o);
  auto c = server.client();
  for (int i = 0; i < 6; ++i) {
    const auto res =
        c->Post("/v1/chat/completions", chat_body("", fmt::format("Count to {}.", i + 2), 2).dump(),
                "application/json");
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 200);
    EXPECT_LE(metric(*c, "swarmkv_cached_sequences"), 2) << "after request " << i;
  }
  EXPECT_EQ(metric(*c, "swarmkv_cached_sequences"), 2);
}

// stop() closes the listening socket at once; the request in flight still
// gets its whole answer, then run() returns.
TEST_F(ServerTest, StopLetsTheRequestInFlightFinish) {
  Running server(model_, small_options());
  auto c = server.client();
  auto answer = std::async(std::launch::async, [&] {
    auto mine = server.client();
    return mine->Post("/v1/chat/completions", long_answer_body(48).dump(), "application/json");
  });
  ASSERT_TRUE(await_metric(*c, "swarmkv_live_sequences", 1));
  server.stop();  // joins run()
  const auto res = answer.get();
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const json j = json::parse(res->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 48) << j;
  httplib::Client late("127.0.0.1", server.port());
  EXPECT_FALSE(late.Get("/health"));
}

// Resident memory of this process in bytes (Linux).
int64_t rss_bytes() {
  const std::string status = read_file("/proc/self/status");
  const size_t at = status.find("VmRSS:");
  return at == std::string::npos ? -1 : std::stoll(status.substr(at + 6)) * 1024;
}

// A bounded load: 200 requests at concurrency 16, each a different question
// over one document, then 50 over five documents interleaved (the
// sanitizers: 16 and 25). Every one is answered, and the engine ends with
// nothing live, queued or in flight and (no cache) no KV cell in use;
// memory stays where a warm-up left it.
TEST_F(ServerTest, ABoundedLoadIsAnsweredAndLeavesNothingBehind) {
  ServerOptions o = small_options();
  o.max_live = 16;
  o.max_cached = 0;  // concurrent requests still fork from each other's live sequences
  Running server(model_, o);
  const std::vector<std::string> docs = {document(600), document(600, "mpl-2.0.txt"),
                                         document(1200).substr(600), document(500) + " (copy)",
                                         document(900, "mpl-2.0.txt").substr(400)};
  std::atomic<int> next{0}, ok{0}, other{0};
  const auto worker = [&](int total, bool interleave) {
    auto c = server.client();
    for (int i; (i = next.fetch_add(1)) < total;) {
      const std::string& doc = docs[interleave ? static_cast<size_t>(i) % docs.size() : 0];
      const auto res = c->Post(
          "/v1/chat/completions",
          chat_body("", doc + "\n\nQuestion " + std::to_string(i) + ": what is this about?", 8)
              .dump(),
          "application/json");
      (res && res->status == 200 ? ok : other).fetch_add(1);
      if (!res || res->status != 200) {
        ADD_FAILURE() << "request " << i << ": "
                      << (res ? std::to_string(res->status) + " " + res->body
                              : httplib::to_string(res.error()));
      }
    }
  };
  // 200 repeats of one document show the memory staying flat; the
  // sanitizers (which skip that check) need the concurrency, not the count.
#ifdef SWARMKV_SANITIZED
  constexpr int kRepeats = 16, kInterleaved = 25;
#else
  constexpr int kRepeats = 200, kInterleaved = 50;
#endif
  int64_t rss_warm = 0;
  for (const auto& [total, interleave] :
       {std::pair{16, true}, std::pair{kRepeats, false}, std::pair{kInterleaved, true}}) {
    if (rss_warm == 0 && total != 16) rss_warm = rss_bytes();
    next.store(0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 16; ++t) threads.emplace_back(worker, total, interleave);
    for (auto& t : threads) t.join();
  }
  EXPECT_EQ(ok.load(), 16 + kRepeats + kInterleaved);
  EXPECT_EQ(other.load(), 0);
  auto c = server.client();
  EXPECT_EQ(metric(*c, "swarmkv_requests_total"), 16 + kRepeats + kInterleaved);
  EXPECT_EQ(metric(*c, "swarmkv_live_sequences"), 0);
  EXPECT_EQ(metric(*c, "swarmkv_queue_length"), 0);
  EXPECT_EQ(metric(*c, "swarmkv_requests_in_flight"), 0);
  EXPECT_EQ(metric(*c, "swarmkv_cached_sequences"), 0);
  EXPECT_EQ(metric(*c, "swarmkv_kv_cells_used"), 0);
  EXPECT_GT(metric(*c, "swarmkv_reused_tokens_total"),
            metric(*c, "swarmkv_prefilled_tokens_total"));
#ifndef SWARMKV_SANITIZED  // the sanitizers' own bookkeeping grows under load
  EXPECT_LT(rss_bytes() - rss_warm, int64_t{64} << 20);
#endif
}

}  // namespace
}  // namespace swarmkv
