// A corpus without a model: how its documents are found and checked, how
// its reduce agents' placeholders read, and what they are given.
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "corpus/memory_gate.h"
#include "swarmkv/corpus.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"

namespace swarmkv {
namespace {

class CorpusFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("swarmkv_corpus_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_ / "contracts");
    write("contracts/lease.txt", "The rent is 900 EUR.");
    write("contracts/supply.txt", "The fee is 40 EUR.");
    write("contracts/.hidden", "not a document");
    write("notes.md", "Notes.");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
    return (dir_ / name).string();
  }
  // A pipeline file with these documents and a per-document agent `risks`
  // and the reduce agent's prompt `reduce` (none when empty).
  std::string pipeline(const std::string& documents, const std::string& reduce = "") {
    std::string text = "documents: " + documents + "\nagents:\n  - {name: risks, prompt: q}\n";
    if (!reduce.empty()) text += "  - {name: all, scope: corpus, prompt: \"" + reduce + "\"}\n";
    return write("p.yaml", text);
  }
  std::string error_of(const std::string& path) {
    try {
      load_corpus_file(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
  static std::vector<std::string> names(const CorpusSpec& c) {
    std::vector<std::string> out;
    for (const DocumentRef& d : c.documents) out.push_back(d.name);
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(CorpusFileTest, DocumentsAreFilesFoldersGlobsAndTextInTheirOrder) {
  const CorpusSpec c = load_corpus_file(pipeline(
      "[contracts, 'n*.md', {text: Inline words., name: inline}, {text: More.}]", "{{risks[*]}}"));
  EXPECT_TRUE(c.listed);
  EXPECT_EQ(names(c),
            (std::vector<std::string>{"lease.txt", "supply.txt", "notes.md", "inline", "text-4"}))
      << "a folder's files sorted, hidden ones skipped; a text item's name or text-<n>";
  EXPECT_EQ(c.documents[0].path, (dir_ / "contracts" / "lease.txt").string());
  EXPECT_EQ(c.documents[0].source(), "file:" + (dir_ / "contracts" / "lease.txt").string());
  EXPECT_TRUE(c.documents[0].text.empty()) << "a file is read when its turn comes";
  EXPECT_EQ(c.documents[3].text, "Inline words.");
  ASSERT_EQ(c.pipeline.agents.size(), 1u);
  ASSERT_EQ(c.reduce.size(), 1u);
  EXPECT_EQ(c.reduce[0].name, "all");
  EXPECT_TRUE(c.pipeline.document.empty());
}

TEST_F(CorpusFileTest, OneDocumentIsACorpusOfOne) {
  write("one.yaml", "document: {file: notes.md}\nagents:\n  - {name: a, prompt: q}\n");
  const CorpusSpec c = load_corpus_file((dir_ / "one.yaml").string());
  EXPECT_FALSE(c.listed);
  EXPECT_EQ(names(c), std::vector<std::string>{"notes.md"});
  EXPECT_EQ(c.documents[0].text, "Notes.") << "read once, by the file's reader, and kept";
  EXPECT_EQ(load_pipeline_file((dir_ / "one.yaml").string()).document, "Notes.");
}

TEST_F(CorpusFileTest, BadDocumentsAreRefusedBeforeAnyWork) {
  EXPECT_NE(error_of(pipeline("['*.pdf']")).find("documents[0]: '*.pdf' matches no file"),
            std::string::npos)
      << error_of(pipeline("['*.pdf']"));
  std::filesystem::create_directories(dir_ / "empty");
  EXPECT_NE(error_of(pipeline("[empty]")).find("'empty' matches no file"), std::string::npos);
  write("bin.txt", std::string("ab\0cd", 5));
  EXPECT_NE(error_of(pipeline("[notes.md, bin.txt]"))
                .find("bin.txt' is a binary file (a NUL byte at offset 2); documents are text"),
            std::string::npos)
      << error_of(pipeline("[notes.md, bin.txt]"));
  EXPECT_NE(error_of(pipeline("[missing.txt]")).find("missing.txt' does not exist"),
            std::string::npos);
  write("lease.txt", "Another lease.");
  const std::string twice = error_of(pipeline("[contracts, lease.txt]"));
  EXPECT_NE(twice.find("two documents are named 'lease.txt'"), std::string::npos) << twice;
  EXPECT_NE(error_of(pipeline("[]")).find("'documents' must be a non-empty list"),
            std::string::npos);
  write("both.yaml",
        "document: {text: x}\ndocuments: [notes.md]\nagents:\n  - {name: a, prompt: q}\n");
  EXPECT_NE(error_of((dir_ / "both.yaml").string())
                .find("give either 'document' or 'documents', not both"),
            std::string::npos);
}

TEST_F(CorpusFileTest, ACorpusIsRefusedWhereOnlyOneDocumentRuns) {
  // serve's /v1/pipelines and the cluster's job messages read one document.
  const nlohmann::json body = {{"documents", {"a.txt"}},
                               {"agents", {{{"name", "a"}, {"prompt", "q"}}}}};
  try {
    parse_pipeline_json(body, "request", "");
    FAIL() << "a corpus was read as one pipeline";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'documents' (a corpus) runs under `swarmkv run` only"),
              std::string::npos)
        << e.what();
  }
  write("one.yaml",
        "document: {text: x}\nagents:\n  - {name: a, prompt: q}\n  - {name: b, scope: corpus, "
        "prompt: q}\n");
  try {
    load_pipeline_file((dir_ / "one.yaml").string());
    FAIL() << "a reduce agent was read into a one-document pipeline";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("agents[1] ('b'): scope: corpus runs once over"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(load_corpus_file((dir_ / "one.yaml").string()).reduce.size(), 1u)
      << "under run, a reduce agent over one document";
}

TEST_F(CorpusFileTest, ReducePlaceholdersNameDocumentsAndFields) {
  write("lease.v2.txt", "A lease, version 2.");
  const CorpusSpec c =
      load_corpus_file(pipeline("[contracts, lease.v2.txt]",
                                "{{risks[*]}} {{risks@lease.txt}} {{risks@lease.v2.txt.level}}"));
  const auto every = corpus_placeholder(c, "risks[*]");
  ASSERT_TRUE(every);
  EXPECT_EQ(every->agent, "risks");
  EXPECT_TRUE(every->document.empty());
  const auto field = corpus_placeholder(c, "risks[*].clauses[0]");
  ASSERT_TRUE(field);
  EXPECT_EQ(field->field, ".clauses[0]");
  const auto one = corpus_placeholder(c, "risks@lease.txt");
  ASSERT_TRUE(one);
  EXPECT_EQ(one->document, "lease.txt");
  const auto longest = corpus_placeholder(c, "risks@lease.v2.txt.level");
  ASSERT_TRUE(longest);
  EXPECT_EQ(longest->document, "lease.v2.txt") << "the longest name the text continues with";
  EXPECT_EQ(longest->field, ".level");
  EXPECT_FALSE(corpus_placeholder(c, "all")) << "a reduce agent is no corpus placeholder";
  for (const auto& [text, words] : std::vector<std::pair<std::string, std::string>>{
           {"risks", "an agent that runs once per document: take {{risks[*]}}"},
           {"risks.level", "an agent that runs once per document"},
           {"risks@nda.txt", "no document is named 'nda.txt'"},
           {"risks[*].", "{{risks[*].}}: the field '.' is not a path"}}) {
    try {
      (void)corpus_placeholder(c, text);
      ADD_FAILURE() << text << " was taken";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kGraph) << text;
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << text << ": " << e.what();
    }
  }
  // The same checks when the file is read, naming the reduce agent.
  const std::string bad = error_of(pipeline("[contracts]", "{{risks@nda.txt}}"));
  EXPECT_NE(bad.find("reduce agent 'all': {{risks@nda.txt}}: no document is named 'nda.txt'"),
            std::string::npos)
      << bad;
  // A reduce agent's other placeholders follow a pipeline's rules.
  const std::string unknown = error_of(pipeline("[contracts]", "{{nobody}}"));
  EXPECT_NE(unknown.find("placeholder {{nobody}} names unknown agent 'nobody'"), std::string::npos)
      << unknown;
}

// A document's result with agent `risks` answering `answer` (ok) or failed.
DocumentOutcome outcome(const std::string& name, const std::string& answer, bool ok = true) {
  DocumentOutcome d;
  d.name = name;
  d.source = "text";
  PipelineResult r;
  AgentResult a;
  a.name = "risks";
  a.answer = answer;
  if (!ok) {
    a.status = NodeStatus::kFailed;
    a.error = ErrorValue{ErrorCode::kBudget, "too long"};
  }
  r.agents.push_back(a);
  d.result = r;
  return d;
}

TEST_F(CorpusFileTest, ReduceAgentsAreGivenEveryAnswerInOrderUnderItsDocumentsName) {
  CorpusSpec c = load_corpus_file(
      pipeline("[contracts]", "{{risks[*]}} / {{risks@supply.txt}} / {{risks[*].level}}"));
  std::vector<DocumentOutcome> docs = {outcome("lease.txt", R"({"level": "high"})"),
                                       outcome("supply.txt", R"({"level": 2})")};
  const ReduceInputs in = reduce_inputs(c, docs);
  EXPECT_TRUE(in.failed.empty());
  EXPECT_EQ(in.values.at("risks[*]"),
            "### lease.txt\n{\"level\": \"high\"}\n\n### supply.txt\n{\"level\": 2}");
  EXPECT_EQ(in.values.at("risks@supply.txt"), R"({"level": 2})");
  EXPECT_EQ(in.values.at("risks[*].level"), "### lease.txt\nhigh\n\n### supply.txt\n2")
      << "a string field as its text, any other value as JSON";

  // One document's agent failed: every placeholder that takes it has no value, and says why.
  docs[1] = outcome("supply.txt", "", /*ok=*/false);
  const ReduceInputs failed = reduce_inputs(c, docs);
  EXPECT_FALSE(failed.values.contains("risks[*]"));
  EXPECT_EQ(failed.failed.at("risks@supply.txt").code, ErrorCode::kDependencyFailed);
  EXPECT_NE(failed.failed.at("risks[*]")
                .message.find("agent 'risks' of document 'supply.txt' failed: budget: too long"),
            std::string::npos)
      << failed.failed.at("risks[*]").message;
  // An answer without the field: the placeholder fails, naming the document.
  docs[1] = outcome("supply.txt", R"({"other": 1})");
  const ReduceInputs no_field = reduce_inputs(c, docs);
  EXPECT_NE(no_field.failed.at("risks[*].level").message.find("document 'supply.txt'"),
            std::string::npos);
  EXPECT_TRUE(no_field.values.contains("risks[*]"));
}

TEST_F(CorpusFileTest, TheResultNamesEveryDocumentAndTheSchemaVersion) {
  CorpusResult r;
  r.pipeline = "p";
  r.documents = {outcome("lease.txt", "fine"), DocumentOutcome{}};
  r.documents[1].name = "bad.txt";
  r.documents[1].error = ErrorValue{ErrorCode::kNotFound, "gone"};
  r.documents_run = 1;
  const nlohmann::json j = corpus_json(r);
  EXPECT_EQ(j["schema_version"], kCorpusSchemaVersion);
  EXPECT_EQ(j["kind"], "corpus");
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_EQ(j["documents_failed"], 1);
  ASSERT_EQ(j["documents"].size(), 2u);
  EXPECT_EQ(j["documents"][0]["result"]["agents"][0]["answer"], "fine");
  EXPECT_TRUE(j["documents"][1]["result"].is_null());
  EXPECT_EQ(j["documents"][1]["error"]["code"], "not_found");
  EXPECT_TRUE(j["reduce"].is_null());
}

// --max-documents-live under tight memory: a document that does not fit
// beside the running ones waits for one to end, and runs when it does;
// documents that fit run together; one alone runs whatever it needs (its
// own memory check decides). Every wait here is bounded.
TEST(MemoryGateTest, ADocumentThatDoesNotFitWaitsForAnotherToEnd) {
  using namespace std::chrono_literals;
  detail::MemoryGate gate(10);
  gate.acquire(6);
  std::atomic<bool> started{false};
  auto second = std::async(std::launch::async, [&] {
    const detail::MemoryGate::Hold hold(gate, 6);
    started = true;
  });
  EXPECT_EQ(second.wait_for(200ms), std::future_status::timeout) << "6 + 6 > 10 ran together";
  EXPECT_FALSE(started);
  gate.release(6);
  ASSERT_EQ(second.wait_for(10s), std::future_status::ready) << "the freed memory woke nobody";
  EXPECT_TRUE(started);
  EXPECT_EQ(gate.peak(), 1u);

  gate.acquire(4);
  auto fits = std::async(std::launch::async, [&] { const detail::MemoryGate::Hold hold(gate, 5); });
  ASSERT_EQ(fits.wait_for(10s), std::future_status::ready) << "4 + 5 <= 10 waited";
  EXPECT_EQ(gate.peak(), 2u);
  gate.release(4);
}

TEST(MemoryGateTest, ADocumentAloneRunsWhateverItNeeds) {
  using namespace std::chrono_literals;
  detail::MemoryGate gate(1);
  auto alone =
      std::async(std::launch::async, [&] { const detail::MemoryGate::Hold hold(gate, 100); });
  ASSERT_EQ(alone.wait_for(10s), std::future_status::ready);
  EXPECT_EQ(gate.peak(), 1u);
}

}  // namespace
}  // namespace swarmkv
