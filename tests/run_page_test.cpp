// The run page (swarmkv/run_page.h) from results made by hand: every agent
// in the graph, the timeline and the texts; edges by kind; nothing fetched;
// text escaped; a result that is not one refused by name. No model.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "swarmkv/corpus.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"
#include "swarmkv/run_page.h"

namespace swarmkv {
namespace {

using nlohmann::json;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// 50 agents: 40 from the document (the first 8 with `needs`), 8 reviews of
// five each, a fork_from follow-up, a verdict; one failed, its dependents
// not run; as result_json writes them.
json fifty() {
  PipelineResult r;
  r.pipeline = "fifty";
  r.model = "/models/m.gguf";
  r.prefix_tokens = 2000;
  r.prefill_done_at_ms = 8000;
  r.prefill_ms = 7900;
  r.total_ms = 30000;
  r.snapshot = SnapshotUse{};
  r.snapshot->prefilled_tokens = 2000;
  for (int i = 0; i < 50; ++i) {
    AgentResult a;
    a.name = fmt::format("agent-{}", i);
    a.answer = fmt::format("answer {}", i);
    a.prompt_rendered = fmt::format("question {}", i);
    a.timings_ms.wait = 100;
    a.timings_ms.started_at = 1000 + 300 * i;
    a.timings_ms.first_token_at = a.timings_ms.started_at + 500;
    a.timings_ms.done_at = a.timings_ms.first_token_at + 2000;
    a.tokens = {1, 2, 3};
    a.token_at_ms = {a.timings_ms.first_token_at, a.timings_ms.first_token_at + 900,
                     a.timings_ms.done_at};
    if (i < 8) a.needs.until = "Section 2";
    if (i >= 40 && i < 48) {
      for (int k = 0; k < 5; ++k) a.depends_on.push_back(fmt::format("agent-{}", (i - 40) * 5 + k));
    }
    if (i == 48) a.fork_from = "agent-40";
    if (i == 49) a.depends_on = {"agent-41", "agent-48"};
    r.agents.push_back(a);
  }
  r.agents[1].status = NodeStatus::kFailed;
  r.agents[1].error = ErrorValue{ErrorCode::kNoKvSlot, "no slot"};
  r.agents[40].status = NodeStatus::kDependencyFailed;  // it waits for agent-1
  r.agents[40].error = ErrorValue{ErrorCode::kDependencyFailed, "dependency 'agent-1' failed"};
  r.agents[40].timings_ms = {};
  r.agents[40].token_at_ms.clear();
  return result_json(r);
}

TEST(RunPageTest, EveryAgentIsInTheGraphTheTimelineAndTheTexts) {
  const std::string page = run_page_html(fifty(), "saved.json");
  for (int i = 0; i < 50; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(count(page, fmt::format("id=\"node-{}\"", i)), 1u);
    EXPECT_EQ(count(page, fmt::format("id=\"bar-{}\"", i)), 1u);
    EXPECT_EQ(count(page, fmt::format("id=\"agent-{}\"", i)), 1u);
    EXPECT_NE(page.find(fmt::format("answer {}</pre>", i)), std::string::npos);
  }
  EXPECT_NE(page.find("id=\"bar-document\""), std::string::npos) << "the prefill's bar";
  EXPECT_NE(page.find("<title>fifty — 50 agents</title>"), std::string::npos);
  EXPECT_NE(page.find("<dd>/models/m.gguf</dd>"), std::string::npos);
  EXPECT_NE(page.find("<dd>saved.json</dd>"), std::string::npos);
  EXPECT_NE(page.find("48 ok, 1 failed, 1 not run"), std::string::npos);
}

TEST(RunPageTest, EdgesAreDrawnByKindAndStatusIsWrittenOut) {
  const std::string page = run_page_html(fifty());
  EXPECT_EQ(count(page, "class=\"edge depends\""), 8u * 5 + 2 + 1);  // + the legend's sample
  EXPECT_EQ(count(page, "class=\"edge fork\""), 1u + 1);
  EXPECT_EQ(count(page, "class=\"edge needs\""), 8u + 1);
  EXPECT_EQ(count(page, "class=\"edge doc\""), 40u - 8 + 1);
  EXPECT_NE(page.find("agent-48 continues agent-40&#39;s conversation (fork_from)"),
            std::string::npos);
  EXPECT_NE(page.find("needs up to &quot;Section 2&quot;"), std::string::npos);
  // Status in words, not only in colour; the error and the cause shown.
  EXPECT_NE(page.find("<span class=\"status\">FAILED</span>"), std::string::npos);
  EXPECT_NE(page.find("not run: a dependency failed"), std::string::npos);
  EXPECT_NE(page.find("no_kv_slot: no slot"), std::string::npos);
  // Distinct dash patterns in the style for the edges that colour alone would tell apart.
  EXPECT_NE(page.find(".edge.fork{stroke-width:2.6;stroke-dasharray:8 4}"), std::string::npos);
  EXPECT_NE(page.find(".edge.needs{stroke:#555;stroke-width:1.6;stroke-dasharray:2 3}"),
            std::string::npos);
}

TEST(RunPageTest, NothingIsFetchedAndNoScriptRuns) {
  const std::string page = run_page_html(fifty());
  for (const char* bad : {"<script", "http://", "https://", "src=", "@import", "url(http"}) {
    EXPECT_EQ(page.find(bad), std::string::npos) << bad;
  }
  // Every url() is a reference inside the page. (No std::regex: GCC 12
  // warns inside it at the sanitizer presets' -O1.)
  size_t urls = 0;
  for (size_t at = page.find("url("); at != std::string::npos; at = page.find("url(", at + 1)) {
    ++urls;
    EXPECT_EQ(page[at + 4], '#') << page.substr(at, 40);
  }
  EXPECT_GE(urls, 2u) << "the arrow marker and the queued pattern";
}

TEST(RunPageTest, TextFromTheRunIsEscaped) {
  json r = fifty();
  r["agents"][0]["name"] = "<b>&\"x\"";
  r["agents"][0]["answer"] = "</pre><script>alert(1)</script>";
  r["pipeline"] = "<i>";
  const std::string page = run_page_html(r);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("<b>&"), std::string::npos);
  EXPECT_NE(page.find("&lt;b&gt;&amp;&quot;x&quot;"), std::string::npos);
  EXPECT_NE(page.find("&lt;/pre&gt;&lt;script&gt;alert(1)&lt;/script&gt;"), std::string::npos);
  EXPECT_NE(page.find("<title>&lt;i&gt; — 50 agents</title>"), std::string::npos);
}

// A structured answer (answer_json) is shown as its fields, in the order
// they were generated, then as JSON; keys and values escaped.
TEST(RunPageTest, AStructuredAnswerIsShownAsItsFields) {
  json r = fifty();
  r["agents"][2]["answer"] = R"({"risk_level": "high", "clauses": [3, 7], "<k>": "<v>"})";
  r["agents"][2]["answer_json"] = json::parse(r["agents"][2]["answer"].get<std::string>());
  r["agents"][3]["answer"] = R"(["a", {"b": 1}])";
  r["agents"][3]["answer_json"] = json::parse(r["agents"][3]["answer"].get<std::string>());
  const std::string page = run_page_html(r);
  EXPECT_NE(page.find("<dl class=\"fields\"><dt>risk_level</dt><dd>high</dd>"
                      "<dt>clauses</dt><dd>[3,7]</dd><dt>&lt;k&gt;</dt><dd>&lt;v&gt;</dd></dl>"),
            std::string::npos)
      << page.substr(page.find("id=\"agent-2\""), 900);
  EXPECT_NE(page.find("<dl class=\"fields\"><dt>[0]</dt><dd>a</dd><dt>[1]</dt><dd>{&quot;b&quot;:1}"
                      "</dd></dl>"),
            std::string::npos);
  EXPECT_NE(page.find("<summary>As JSON</summary><pre class=\"answer\">{&quot;risk_level&quot;"),
            std::string::npos);
  EXPECT_EQ(count(page, "<dl class=\"fields\">"), 2u);  // free-text answers stay text
}

// A corpus of three documents (one with a JSON answer, one that could not
// be read) and a reduce agent that could not run.
TEST(RunPageTest, ACorpusIsATableOfDocumentsThenItsReduceAgents) {
  CorpusResult c;
  c.pipeline = "licences";
  const auto doc = [](const std::string& name, const std::string& facts) {
    DocumentOutcome d;
    d.name = name;
    d.source = "file:/c/" + name;
    PipelineResult r;
    AgentResult a;
    a.name = "summary";
    a.answer = "about " + name + " <b>";
    AgentResult f;
    f.name = "facts";
    f.answer = facts;
    f.answer_is_json = true;
    r.agents = {a, f};
    d.result = r;
    return d;
  };
  c.documents = {doc("mit.txt", R"({"copyleft": false})"), DocumentOutcome{},
                 doc("gpl-2.txt", R"({"copyleft": true})")};
  c.documents[1].name = "gone.txt";
  c.documents[1].error =
      ErrorValue{ErrorCode::kNotFound, "document file 'gone.txt' does not exist"};
  PipelineResult reduce;
  AgentResult all;
  all.name = "compare";
  all.status = NodeStatus::kDependencyFailed;
  all.error = ErrorValue{ErrorCode::kDependencyFailed, "dependency 'summary[*]' failed"};
  reduce.agents = {all};
  c.reduce = reduce;
  c.documents_run = 2;
  const std::string page = corpus_page_html(corpus_json(c), "saved.json");
  EXPECT_NE(page.find("<title>licences — 3 documents</title>"), std::string::npos);
  EXPECT_NE(page.find("<tr><th>document</th><th>summary</th><th>facts</th></tr>"),
            std::string::npos);
  EXPECT_NE(page.find("<td>about mit.txt &lt;b&gt;</td><td><dl class=\"fields\"><dt>copyleft</dt>"
                      "<dd>false</dd></dl></td>"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("<td class=\"error\" colspan=\"2\">not_found: document file "
                      "&#39;gone.txt&#39; does not exist</td>"),
            std::string::npos);
  EXPECT_LT(page.find("mit.txt"), page.find("gone.txt"));
  EXPECT_LT(page.find("gone.txt"), page.find("gpl-2.txt")) << "rows in the corpus's order";
  EXPECT_NE(page.find("<h2 id=\"reduce\">Over every document</h2>"), std::string::npos);
  EXPECT_NE(page.find("dependency &#39;summary[*]&#39; failed"), std::string::npos);
  EXPECT_EQ(page.find("<script"), std::string::npos);
  try {
    corpus_page_html(json{{"agents", json::array()}});
    ADD_FAILURE() << "a one-document result drew a corpus page";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCorruption);
    EXPECT_NE(e.message().find("the result has no 'documents'"), std::string::npos);
  }
}

TEST(RunPageTest, AResultThatIsNotOneIsRefusedByName) {
  const auto message = [](const json& j) {
    try {
      run_page_html(j);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruption);
      return e.message();
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(message(json::array()),
            "the result is not a JSON object (not a swarmkv run --json result?)");
  EXPECT_EQ(message(json::object()),
            "the result has no 'agents' (not a swarmkv run --json result?)");
  EXPECT_EQ(message(json{{"agents", 3}}), "the result's 'agents' is not a list");
  EXPECT_EQ(message(json{{"agents", {{{"status", "ok"}}}}}),
            "the result has no 'name' in agent 0 (not a swarmkv run --json result?)");
  json r = fifty();
  r["agents"][2]["started_at_ms"] = "soon";
  EXPECT_EQ(message(r).rfind("agent 2 of the result does not read: ", 0), 0u) << message(r);
  json model = fifty();
  model["model"] = nullptr;
  EXPECT_EQ(message(model).rfind("the result does not read: ", 0), 0u) << message(model);
  // A cycle or an unknown name (a hand-edited file) is drawn, not refused.
  json odd = fifty();
  odd["agents"][0]["depends_on"] = {"agent-1", "nobody"};
  odd["agents"][1]["depends_on"] = {"agent-0"};
  EXPECT_NE(run_page_html(odd).find("id=\"node-0\""), std::string::npos);
}

}  // namespace
}  // namespace swarmkv
