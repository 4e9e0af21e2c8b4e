// The completion engine (src/server/completion_engine.h) driven directly,
// where a case needs an order of events HTTP clients cannot pin down.
#include "server/completion_engine.h"

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "test_models.h"

namespace swarmkv::server {
namespace {

using namespace std::chrono_literals;

std::string read_document(const std::string& file) {
  std::ifstream in(std::string(SWARMKV_SOURCE_DIR) + "/examples/documents/" + file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Events until the request finishes; its usage (fails the test on kFailed
// or on a request that hangs).
Usage drain(Job& job) {
  for (int i = 0; i < 2000; ++i) {
    const std::optional<Event> e = job.next(60s);
    if (!e) {
      ADD_FAILURE() << "no event within 60 s";
      return {};
    }
    if (e->kind == Event::Kind::kFailed) {
      ADD_FAILURE() << e->error.to_string();
      return {};
    }
    if (e->kind == Event::Kind::kFinished) return e->usage;
  }
  ADD_FAILURE() << "no kFinished after 2000 events";
  return {};
}

// Exact mode: requests queued when the cache starts over are admitted in
// one pass, before anything decodes. A document's second request waits on
// its first (itself still waiting on the chat template's tokens) instead of
// prefilling the document again (bench/results/serve-load: one document
// prefilled twice after each reset, ~5,900 tokens of a 166 s run).
TEST(CompletionEngineExactTest, RequestsQueuedAtAResetPrefillEachDocumentOnce) {
  std::shared_ptr<const Model> model;
  try {
    model = test::load_test_model(test::kSmolLM2, ModelOptions{.batch_invariant = true});
  } catch (const Error& e) {  // another test of this process decoded first
    GTEST_SKIP() << "needs a process of its own (ctest runs each case alone): " << e.what();
  }
  if (!model) GTEST_SKIP() << "SWARMKV_TEST_MODEL is not set";
  if (!attention_batch_invariant()) GTEST_SKIP() << "needs the batch-invariant attention kernel";
  EngineSettings settings;
  EngineOptions options;
  options.exact = true;
  options.context = settings.context_options();
  options.context.n_ctx = 1024;
  options.max_live = 4;
  options.max_cached = 4;
  CompletionEngine engine(model, options);

  const std::string apache = read_document("apache-2.0.txt");
  const std::string mpl = read_document("mpl-2.0.txt");
  // Every prompt starts alike, as a chat template's system turn does: so a
  // document's first request forks that start from another document's and
  // waits (kWaiting) until it is decoded.
  const auto request = [&](const std::string& text, int32_t max_tokens) {
    CompletionRequest r;
    r.prompt =
        model->tokenize("You are a careful analyst. Answer from the document only.\n\n" + text,
                        /*add_special=*/true);
    r.max_tokens = max_tokens;
    return r;
  };
  // A long request that leaves no room for the others until it finishes.
  CompletionRequest blocker = request(apache.substr(3400, 4200) + "\n\nList every term.", 48);
  const CompletionRequest a = request(apache.substr(0, 1000) + "\n\nWho is named?", 16);
  const CompletionRequest b1 = request(mpl.substr(0, 1000) + "\n\nWhat is covered?", 16);
  const CompletionRequest b2 = request(mpl.substr(0, 1000) + "\n\nWho may use it?", 16);
  const size_t b_shared = common_prefix(b1.prompt, b2.prompt);
  ASSERT_GT(b_shared, 150u);
  ASSERT_GT(blocker.prompt.size() + 48 + a.prompt.size(), 1024u) << "the blocker must block";

  const std::shared_ptr<Job> first = engine.submit(blocker);
  const std::optional<Event> generating = first->next(60s);  // its first answer text
  ASSERT_TRUE(generating && generating->kind == Event::Kind::kDelta);
  const std::shared_ptr<Job> ja = engine.submit(a);
  const std::shared_ptr<Job> jb1 = engine.submit(b1);
  const std::shared_ptr<Job> jb2 = engine.submit(b2);
  drain(*first);
  drain(*ja);
  drain(*jb1);
  const Usage u2 = drain(*jb2);
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.kv_resets, 1u) << "the three waited for the blocker, then the cache started over";
  EXPECT_GE(static_cast<size_t>(u2.cached_tokens), b_shared)
      << "the document's second request forked it from the first";
  const size_t once =
      blocker.prompt.size() + a.prompt.size() + b1.prompt.size() + (b2.prompt.size() - b_shared);
  EXPECT_LE(stats.prefilled_tokens, once) << "a document prefilled twice";
}

}  // namespace
}  // namespace swarmkv::server
