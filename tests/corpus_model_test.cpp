// A corpus on the real model: each document's answers equal its own
// pipeline re-prefilled, the reduce agents see every answer in order, a
// failed document stops only what needs it, and a resumed run runs only
// what is missing.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "swarmkv/corpus.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"
#include "test_models.h"

namespace swarmkv {
namespace {

class CorpusModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    corpus_.pipeline.exact = true;
    try {
      model_ = test::load_test_model(test::kSmolLM2, corpus_.pipeline.model_options());
    } catch (const Error& e) {  // another test of this process decoded first
      GTEST_SKIP() << "needs a process of its own (ctest runs each case alone): " << e.what();
    }
    if (!model_) GTEST_SKIP() << "SWARMKV_TEST_MODEL is not set";
    dir_ = std::filesystem::temp_directory_path() /
           ("swarmkv_corpus_model_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    const char* texts[] = {
        "Lease. The tenant pays 1200 EUR rent per month. The lease ends on 31 March 2027.",
        "Supply. The supplier delivers 40 chairs by 5 May. Late delivery costs 2 percent a week.",
        "Employment. The employee works 38 hours a week, earns 3100 EUR and has 30 days of leave."};
    const char* names[] = {"lease.txt", "supply.txt", "job.txt"};
    for (int i = 0; i < 3; ++i) {
      std::ofstream(dir_ / names[i]) << texts[i];
      DocumentRef d;
      d.name = names[i];
      d.path = (dir_ / names[i]).string();
      corpus_.documents.push_back(d);
    }
    corpus_.pipeline.agents = {agent("money", "What sum of money does the text mention? One line."),
                               agent("dates", "Which date or duration does it mention? One line.")};
    AgentSpec all = agent("largest", "The sums by contract:\n{{money[*]}}\n\nWhich is largest?");
    AgentSpec pair = agent("pair",
                           "{{largest}}\nAnd the supply contract's dates: {{dates@supply.txt}}. "
                           "Summarise in one line.");
    pair.depends_on = {"largest"};
    corpus_.reduce = {all, pair};
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  static AgentSpec agent(const std::string& name, const std::string& prompt) {
    AgentSpec a;
    a.name = name;
    a.prompt = prompt;
    a.max_tokens = 16;
    return a;
  }
  static const AgentResult& named(const PipelineResult& r, const std::string& name) {
    for (const AgentResult& a : r.agents)
      if (a.name == name) return a;
    throw std::runtime_error("no agent " + name);
  }

  CorpusSpec corpus_;
  std::shared_ptr<const Model> model_;
  std::filesystem::path dir_;
};

// shared (the default) == none for the documents and the reduce agents,
// and each document == its own pipeline re-prefilled, token for token.
TEST_F(CorpusModelTest, EachDocumentEqualsItsOwnReprefillAndReduceAgentsSeeEveryAnswerInOrder) {
  const CorpusResult shared = run_corpus(corpus_, model_);
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared.documents_run, 3u);
  CorpusSpec none_spec = corpus_;
  none_spec.pipeline.fork = ForkMode::kNone;
  const CorpusResult none = run_corpus(none_spec, model_);
  ASSERT_TRUE(none.ok());
  std::string expected_sums;
  for (size_t i = 0; i < corpus_.documents.size(); ++i) {
    SCOPED_TRACE(corpus_.documents[i].name);
    PipelineSpec alone = none_spec.pipeline;
    std::ifstream in(corpus_.documents[i].path);
    alone.document.assign(std::istreambuf_iterator<char>(in), {});
    const PipelineResult reprefilled = run_pipeline(alone, model_);
    ASSERT_TRUE(reprefilled.ok());
    const PipelineResult& mine = *shared.documents[i].result;
    ASSERT_EQ(mine.agents.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(mine.agents[k].tokens, reprefilled.agents[k].tokens) << mine.agents[k].name;
      EXPECT_EQ(mine.agents[k].tokens, none.documents[i].result->agents[k].tokens);
      EXPECT_FALSE(mine.agents[k].tokens.empty());
    }
    expected_sums +=
        (i ? "\n\n### " : "### ") + corpus_.documents[i].name + "\n" + named(mine, "money").answer;
  }
  ASSERT_TRUE(shared.reduce);
  const AgentResult& largest = named(*shared.reduce, "largest");
  EXPECT_EQ(largest.prompt_rendered,
            "The sums by contract:\n" + expected_sums + "\n\nWhich is largest?");
  const AgentResult& pair = named(*shared.reduce, "pair");
  EXPECT_EQ(pair.prompt_rendered, largest.answer + "\nAnd the supply contract's dates: " +
                                      named(*shared.documents[1].result, "dates").answer +
                                      ". Summarise in one line.");
  for (const std::string name : {"largest", "pair"}) {
    EXPECT_EQ(named(*shared.reduce, name).tokens, named(*none.reduce, name).tokens) << name;
  }
  EXPECT_EQ(shared.reduce->prefix_tokens, none.reduce->prefix_tokens);
  EXPECT_EQ(shared.reduce->snapshot->source, SnapshotSource::kPrefill);
}

// Two documents at once (as on a cluster), each on a thread of its own:
// the same answers as one at a time, in the corpus's order, progress
// reported once per document; with memory for one, one at a time.
TEST_F(CorpusModelTest, TwoDocumentsAtOnceGiveTheSameAnswersInOrder) {
  const CorpusResult shared = run_corpus(corpus_, model_);
  ASSERT_TRUE(shared.ok());
  CorpusOptions two;
  two.documents_live = 2;
  size_t calls = 0;
  two.on_progress = [&](const CorpusProgress& p) { EXPECT_EQ(p.done, ++calls); };
  const CorpusResult both = run_corpus(corpus_, model_, two);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(calls, 3u);
  for (size_t i = 0; i < corpus_.documents.size(); ++i) {
    EXPECT_EQ(both.documents[i].name, corpus_.documents[i].name);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(both.documents[i].result->agents[k].tokens,
                shared.documents[i].result->agents[k].tokens);
    }
  }
  EXPECT_EQ(named(*both.reduce, "pair").tokens, named(*shared.reduce, "pair").tokens);
  EXPECT_GE(both.documents_live_peak, 1u);
  EXPECT_LE(both.documents_live_peak, 2u);

  // Memory for one document only: they run one at a time instead of
  // failing for memory, with the same answers.
  CorpusOptions tight = two;
  calls = 0;
  tight.memory_budget = 1;
  const CorpusResult one_by_one = run_corpus(corpus_, model_, tight);
  ASSERT_TRUE(one_by_one.ok());
  EXPECT_EQ(one_by_one.documents_live_peak, 1u);
  for (size_t i = 0; i < corpus_.documents.size(); ++i) {
    EXPECT_EQ(one_by_one.documents[i].result->agents[0].tokens,
              shared.documents[i].result->agents[0].tokens);
  }
}

TEST_F(CorpusModelTest, AFailedDocumentFailsOnlyItselfAndTheReduceAgentsThatTakeIt) {
  std::filesystem::remove(corpus_.documents[0].path);  // after the check: gone mid-run
  AgentSpec one = agent("one", "{{money@job.txt}} Is that a salary?");
  corpus_.reduce.push_back(one);
  const CorpusResult r = run_corpus(corpus_, model_);
  EXPECT_FALSE(r.ok());
  ASSERT_EQ(r.documents.size(), 3u);
  ASSERT_TRUE(r.documents[0].error);
  EXPECT_EQ(r.documents[0].error->code, ErrorCode::kNotFound) << r.documents[0].error->to_string();
  EXPECT_TRUE(r.documents[1].ok());
  EXPECT_TRUE(r.documents[2].ok()) << "the documents after it still run";
  EXPECT_EQ(r.documents_run, 2u);
  ASSERT_TRUE(r.reduce);
  const AgentResult& largest = named(*r.reduce, "largest");
  EXPECT_EQ(largest.status, NodeStatus::kDependencyFailed);
  EXPECT_NE(largest.error->message.find("dependency 'money[*]' failed: dependency_failed: "
                                        "document 'lease.txt' failed: not_found"),
            std::string::npos)
      << largest.error->message;
  EXPECT_EQ(named(*r.reduce, "pair").status, NodeStatus::kDependencyFailed)
      << "it waits on a reduce agent that could not run";
  const AgentResult& ok = named(*r.reduce, "one");
  EXPECT_EQ(ok.status, NodeStatus::kOk) << (ok.error ? ok.error->to_string() : "");
  EXPECT_FALSE(ok.tokens.empty());
}

TEST_F(CorpusModelTest, AReduceAgentThatCouldOutgrowTheContextIsRefusedBeforeAnyDocument) {
  corpus_.pipeline.agents[0].max_tokens = 3000;  // x 3 documents > SmolLM2's 8192
  CorpusOptions options;
  options.out_dir = (dir_ / "out").string();
  try {
    (void)run_corpus(corpus_, model_, options);
    FAIL() << "the reduce agent's budget was not checked";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBudget);
    EXPECT_NE(std::string(e.what()).find("reduce agent 'largest' may need"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("> n_ctx_train 8192"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out")) << "refused before any work";
  // A server's context limit caps it lower (serve --max-pipeline-ctx).
  corpus_.pipeline.agents[0].max_tokens = 300;
  EXPECT_NO_THROW(check_reduce_budget(corpus_, *model_));
  try {
    check_reduce_budget(corpus_, *model_, 512);
    FAIL() << "the server's limit was not applied";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBudget);
    EXPECT_NE(std::string(e.what()).find(
                  "> n_ctx 512, the most this server allows (--max-pipeline-ctx) (3 documents)"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(CorpusModelTest, AResumedRunTakesWhatIsDoneAndRunsOnlyTheRest) {
  CorpusOptions options;
  options.out_dir = (dir_ / "out").string();
  const CorpusResult first = run_corpus(corpus_, model_, options);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first.documents_run, 3u);
  std::vector<std::filesystem::path> saved;
  for (const auto& e : std::filesystem::directory_iterator(dir_ / "out" / "documents"))
    saved.push_back(e.path());
  ASSERT_EQ(saved.size(), 3u);
  std::sort(saved.begin(), saved.end());
  std::filesystem::remove(saved[1]);  // as if killed before that document finished
  const CorpusResult second = run_corpus(corpus_, model_, options);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second.documents_run, 1u);
  EXPECT_EQ(second.documents_resumed, 2u);
  for (size_t i = 0; i < 3; ++i) {
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_EQ(second.documents[i].result->agents[k].tokens,
                first.documents[i].result->agents[k].tokens);
      EXPECT_EQ(second.documents[i].result->agents[k].answer,
                first.documents[i].result->agents[k].answer);
    }
  }
  EXPECT_EQ(named(*second.reduce, "pair").tokens, named(*first.reduce, "pair").tokens);
  // Another pipeline (or model, or engine) is not taken for this one.
  corpus_.pipeline.agents[0].max_tokens = 8;
  const CorpusResult other = run_corpus(corpus_, model_, options);
  EXPECT_EQ(other.documents_run, 3u);
  EXPECT_EQ(other.documents_resumed, 0u);
}

}  // namespace
}  // namespace swarmkv
