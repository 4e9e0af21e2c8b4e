// Pipeline validation and budgets, without a model.
#include <cstdlib>
#include <limits>
#include <string>

#include <fmt/format.h>

#include <gtest/gtest.h>

#include "pipeline/fork_strategy.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"
#include "swarmkv/result_json.h"

namespace swarmkv {
namespace {

PipelineSpec four_agents() {
  PipelineSpec spec;
  spec.document = "A short document.";
  for (int i = 0; i < 4; ++i) {
    AgentSpec a;
    a.name = "agent" + std::to_string(i);
    a.prompt = "Question " + std::to_string(i);
    spec.agents.push_back(a);
  }
  return spec;
}

std::string validation_error(const PipelineSpec& spec) {
  try {
    validate_pipeline(spec);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::string budget_error(ForkMode fork, uint32_t n_ctx) {
  try {
    plan_budget(fork, 1000, {30, 50, 40}, {64, 16, 32}, n_ctx);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kBudget);
    return e.what();
  }
  return "no error";
}

TEST(PipelineValidationTest, ErrorsAreExact) {
  EXPECT_EQ(validation_error(four_agents()), "no error");

  PipelineSpec spec = four_agents();
  spec.document = "  \n\t";
  spec.document_source = "file:empty.txt";
  EXPECT_EQ(validation_error(spec), "invalid_argument: the document is empty (file:empty.txt)");

  spec = four_agents();
  spec.agents.clear();
  EXPECT_EQ(validation_error(spec), "invalid_argument: the pipeline has no agents");

  spec = four_agents();
  spec.agents[1].name = spec.agents[0].name;
  EXPECT_EQ(validation_error(spec), "graph: duplicate node name 'agent0'");

  spec = four_agents();
  spec.agents[2].depends_on = {"nobody"};
  EXPECT_EQ(validation_error(spec), "graph: node 'agent2' depends on unknown node 'nobody'");

  spec = four_agents();
  spec.agents[0].depends_on = {"agent1"};
  spec.agents[1].depends_on = {"agent0"};
  EXPECT_EQ(validation_error(spec), "graph: cycle: edge 'agent1 -> agent0' closes a cycle");

  spec = four_agents();
  spec.agents[3].name = "document";
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent name 'document' is reserved for the document node");

  spec = four_agents();
  spec.agents[1].prompt.clear();
  EXPECT_EQ(validation_error(spec), "invalid_argument: agent 'agent1' has an empty prompt");

  spec = four_agents();
  spec.agents[2].max_tokens = 0;
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent2': max_tokens must be >= 1 (got 0)");
}

TEST(PlaceholderTest, PromptsAreRenderedInOnePassWithTheNamedAnswers) {
  const std::vector<PromptPlaceholder> holes =
      prompt_placeholders("Risks: {{risks}}; {{ terms }} and {{ unclosed");
  ASSERT_EQ(holes.size(), 2u);
  EXPECT_EQ(holes[0].name, "risks");
  EXPECT_EQ(holes[0].begin, 7u);
  EXPECT_EQ(holes[0].end, 16u);
  EXPECT_EQ(holes[1].name, "terms");
  // An answer holding braces goes in as text: it is never expanded again.
  EXPECT_EQ(render_prompt("Risks: {{risks}}; {{ terms }} and {{ unclosed",
                          {{"risks", "a {{terms}} b"}, {"terms", "T"}}),
            "Risks: a {{terms}} b; T and {{ unclosed");
  EXPECT_EQ(render_prompt("no placeholder", {}), "no placeholder");
}

TEST(PlaceholderTest, APlaceholderMustNameAnUpstreamAgent) {
  PipelineSpec spec = four_agents();
  spec.agents[3].prompt = "Weigh {{agent0}} against {{ agent1 }}.";
  spec.agents[3].depends_on = {"agent2"};
  spec.agents[2].depends_on = {"agent0"};
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agent1}} names agent 'agent1', which is not "
            "among its dependencies (add 'agent1' to depends_on)");
  spec.agents[3].depends_on = {"agent2", "agent1"};  // agent0 through agent2
  EXPECT_EQ(validation_error(spec), "no error");
  spec.agents[3].prompt = "Weigh {{agnet0}}.";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agnet0}} names unknown agent 'agnet0'");
  spec.agents[3].prompt = "Myself: {{agent3}}.";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agent3}} names agent 'agent3', which is not "
            "among its dependencies (add 'agent3' to depends_on)");
  spec = four_agents();
  spec.max_live = -1;
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: max_live must be >= 0 (0: as many as fit; got -1)");
}

// {{name.field}}: a field of an upstream JSON answer, checked against the
// upstream's schema before the run, and inserted as text (a string) or JSON.
TEST(PlaceholderTest, AFieldOfAJsonAnswerIsCheckedAgainstItsSchemaAndInserted) {
  PipelineSpec spec = four_agents();
  spec.agents[0].json_schema = R"({"type":"object","properties":{"level":{"type":"string"},)"
                               R"("clauses":{"type":"array","items":{"type":"object",)"
                               R"("properties":{"text":{"type":"string"}}}}}})";
  spec.agents[1].name = "v1.2";  // a name with a dot is still a whole name
  spec.agents[3].depends_on = {"agent0", "v1.2"};
  spec.agents[3].prompt = "Level {{agent0.level}}, first {{ agent0.clauses[0].text }}, {{v1.2}}.";
  EXPECT_EQ(validation_error(spec), "no error");
  const auto ref = resolve_placeholder(spec, "agent0.clauses[0].text");
  ASSERT_TRUE(ref);
  EXPECT_EQ(ref->agent, "agent0");
  EXPECT_EQ(ref->field, ".clauses[0].text");
  EXPECT_EQ(resolve_placeholder(spec, "v1.2")->field, "");
  EXPECT_FALSE(resolve_placeholder(spec, "nobody.level"));

  const std::string answer = R"({"level": "high", "clauses": [{"text": "no sublet"}], "n": 2})";
  const std::vector<std::string> answers = {answer, "plain", "", ""};
  const auto values = placeholder_values(
      spec, spec.agents[3].prompt, [&](size_t k) -> const std::string& { return answers[k]; });
  EXPECT_EQ(render_prompt(spec.agents[3].prompt, values), "Level high, first no sublet, plain.");
  EXPECT_EQ(placeholder_value({"agent0", ".n"}, answer), "2");
  EXPECT_EQ(placeholder_value({"agent0", ".clauses"}, answer), R"([{"text":"no sublet"}])");
  EXPECT_THROW(placeholder_value({"agent0", ".missing"}, answer), Error);
  EXPECT_THROW(placeholder_value({"agent0", ".level"}, "not json"), Error);

  spec.agents[3].prompt = "{{agent0.levle}}";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agent0.levle}}: 'levle' is not among its "
            "schema's properties ('agent0')");
  spec.agents[3].prompt = "{{agent0.clauses.text}}";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agent0.clauses.text}}: 'text' names a property "
            "of a list ('agent0')");
  spec.agents[3].prompt = "{{agent0.clauses[x]}}";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agent0.clauses[x]}}: the field '.clauses[x]' "
            "is not a path of .names and [indices]");
  spec.agents[3].prompt = "{{v1.2.level}}";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{v1.2.level}} names unknown agent "
            "'v1.2.level'");
  spec.agents[3].prompt = "{{agent2.level}}";
  spec.agents[3].depends_on = {"agent2"};
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': placeholder {{agent2.level}} takes a field of the answer of "
            "'agent2', which has no json_schema (its answer is text)");
}

TEST(ForkTreeTest, ForkFromNamesAnAgentAndImpliesTheDependency) {
  PipelineSpec spec = four_agents();
  spec.agents[1].fork_from = "agent0";
  spec.agents[2].fork_from = "agent1";
  spec.agents[2].prompt = "Given {{agent0}}, go on.";  // an ancestor: a dependency
  EXPECT_EQ(validation_error(spec), "no error");
  spec.agents[3].fork_from = "agent9";
  EXPECT_EQ(validation_error(spec),
            "graph: agent 'agent3': fork_from names unknown agent 'agent9'");
  spec.agents[3].fork_from = "agent3";
  EXPECT_EQ(validation_error(spec), "graph: agent 'agent3' cannot fork from itself");
  spec.agents[3].fork_from.clear();
  spec.agents[0].fork_from = "agent2";
  EXPECT_EQ(validation_error(spec), "graph: cycle: edge 'agent1 -> agent0' closes a cycle");
}

TEST(WatermarkTest, NeedsAreChecked) {
  PipelineSpec spec = four_agents();
  spec.agents[0].needs.tokens = 2;
  spec.agents[1].needs.until = "short";
  EXPECT_EQ(validation_error(spec), "no error");
  spec.agents[1].needs.until = "long";
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent1': needs.until: 'long' is not in the document");
  spec.agents[1].needs.tokens = 4;
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent1': needs takes 'tokens' or 'until', not both");
  spec.agents[1].needs = {};
  spec.agents[1].fork_from = "agent0";
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent1': fork_from names 'agent0', which reads only part of "
            "the document (needs); fork from an agent that reads all of it");
  spec.agents[1].fork_from.clear();
  spec.agents[0].fork_from = "agent2";
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent0': needs and fork_from do not combine (a child reads "
            "its parent's whole conversation)");
  spec.agents[0].fork_from.clear();
  spec.exact = true;  // the streamed document is exact too
  EXPECT_EQ(validation_error(spec), "no error");
}

TEST(LatencyTest, PercentilesInterpolateBetweenOrderStatistics) {
  const Percentiles p = percentiles({40, 10, 30, 20, 50});
  EXPECT_DOUBLE_EQ(p.p50, 30);
  EXPECT_DOUBLE_EQ(p.p95, 48);    // rank 3.8: 40 + 0.8 * 10
  EXPECT_DOUBLE_EQ(p.p99, 49.6);  // rank 3.96
  EXPECT_DOUBLE_EQ(percentiles({7}).p99, 7);
  EXPECT_DOUBLE_EQ(percentiles({}).p50, 0);

  PipelineResult r;
  r.agents.resize(3);
  r.agents[0].timings_ms = {.wait = 1, .first_token_at = 100, .done_at = 300};
  r.agents[0].token_at_ms = {100, 110, 130};
  r.agents[1].timings_ms = {.wait = 3, .first_token_at = 200, .done_at = 500};
  r.agents[1].token_at_ms = {200, 240};
  r.agents[2].status = NodeStatus::kFailed;  // not counted
  r.agents[2].timings_ms = {.wait = 1000, .first_token_at = 1000, .done_at = 1000};
  const LatencySummary l = latency_summary(r);
  EXPECT_EQ(l.agents, 2u);
  EXPECT_DOUBLE_EQ(l.queue.p50, 2);
  EXPECT_DOUBLE_EQ(l.ttft.p50, 150);
  EXPECT_DOUBLE_EQ(l.completion.p99, 498);
  EXPECT_DOUBLE_EQ(l.inter_token.p50, 20);  // gaps 10, 20, 40 pooled over both agents
  const nlohmann::json j = result_json(r);
  EXPECT_DOUBLE_EQ(j["latency"]["inter_token_ms"]["p50"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(j["latency"]["ttft_ms"]["p95"].get<double>(), 195);
  EXPECT_DOUBLE_EQ(j["agents"][1]["done_at_ms"].get<double>(), 500);
}

// One rule for sampling settings, in the engine and the pipeline alike: a
// negative temperature is an error, not a silent greedy run.
TEST(PipelineValidationTest, SamplingSettingsAreCheckedByTheEnginesOneRule) {
  PipelineSpec spec = four_agents();
  spec.agents[3].sampling.temperature = -0.5f;
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent3': need temperature >= 0, top_p in (0, 1], top_k >= 0 "
            "(got -0.5, 1, 0)");
  SamplingOptions negative;
  negative.temperature = -0.5f;
  EXPECT_THROW(validate_sampling(negative), Error);
  spec = four_agents();
  spec.agents[0].sampling.top_p = 1.5f;
  EXPECT_EQ(validation_error(spec),
            "invalid_argument: agent 'agent0': need temperature >= 0, top_p in (0, 1], top_k >= 0 "
            "(got 0, 1.5, 0)");
}

// prefix 1000; prompts 30, 50, 40; max_tokens 64, 16, 32.
TEST(PipelineBudgetTest, ContextPerBranchHoldsThePrefixTheLongestPromptAndTheLargestAnswer) {
  for (const ForkMode fork : {ForkMode::kHost, ForkMode::kNone}) {
    const PipelineBudget b = plan_budget(fork, 1000, {30, 50, 40}, {64, 16, 32}, 0);
    EXPECT_EQ(b.max_branch_tokens, 50);
    EXPECT_EQ(b.max_new_tokens, 64);
    EXPECT_EQ(b.required, 1000 + 50 + 64);
    EXPECT_EQ(b.n_ctx, 1280u) << "the smallest multiple of 256 that fits";
    EXPECT_EQ(b.n_seq_max, 1u);
  }
  EXPECT_EQ(budget_error(ForkMode::kHost, 1113),
            "budget: context budget exceeded: prefix_tokens 1000 + max_branch_tokens 50 + "
            "max_new_tokens 64 = required 1114 > n_ctx 1113");
  EXPECT_EQ(budget_error(ForkMode::kHost, 1114), "no error");
}

TEST(PipelineBudgetTest, OneSharedContextHoldsThePrefixOnceAndEveryBranch) {
  const PipelineBudget b = plan_budget(ForkMode::kShared, 1000, {30, 50, 40}, {64, 16, 32}, 0);
  EXPECT_EQ(b.sum_branch_tokens, 30 + 64 + 50 + 16 + 40 + 32);
  EXPECT_EQ(b.required, 1232);
  EXPECT_EQ(b.n_ctx, 1280u);
  EXPECT_EQ(b.n_seq_max, 4u) << "the prefix's sequence and one per agent";
  EXPECT_EQ(budget_error(ForkMode::kShared, 1231),
            "budget: context budget exceeded (fork shared, one context for all): prefix_tokens "
            "1000 + branch_tokens 232 (prompt + max_tokens of 3 agents) = required 1232 > n_ctx "
            "1231");
}

// Hardening: an agent that never ran has no stop reason, and text that is
// not UTF-8 does not cost the whole JSON output.
TEST(ResultJsonTest, AgentsThatDidNotFinishHaveNoStopReason) {
  AgentResult a;
  a.name = "verdict";
  a.status = NodeStatus::kDependencyFailed;
  a.error = ErrorValue{ErrorCode::kDependencyFailed, "dependency 'risks' failed: aborted: x"};
  EXPECT_TRUE(agent_json(a)["stop_reason"].is_null());
  a.status = NodeStatus::kFailed;
  EXPECT_TRUE(agent_json(a)["stop_reason"].is_null());
  a.status = NodeStatus::kOk;
  a.error.reset();
  EXPECT_EQ(agent_json(a)["stop_reason"], "max_tokens");
}

TEST(ResultJsonTest, AnswersCutInsideACharacterStayInTheOutput) {
  AgentResult a;
  a.name = "rocket";
  a.answer = "go \xF0\x9F\x9A";  // the first three bytes of U+1F680
  const std::string text = dump_json(agent_json(a));
  EXPECT_NE(text.find("\"answer\": \"go \xEF\xBF\xBD"), std::string::npos) << text;
  EXPECT_EQ(nlohmann::json::parse(text)["name"], "rocket");
}

TEST(ValidatePipelineTest, ThreadsBatchNamesStopsAndNulBytesAreChecked) {
  const auto error_of = [](const PipelineSpec& spec) {
    try {
      validate_pipeline(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PipelineSpec spec;
  spec.document = "doc";
  spec.agents.emplace_back();
  spec.agents[0].name = "a";
  spec.agents[0].prompt = "q";
  EXPECT_EQ(error_of(spec), "no error");
  PipelineSpec s = spec;
  s.n_threads = 100000;
  EXPECT_NE(error_of(s).find("threads must be 0 (all cores) or 1.."), std::string::npos);
  s = spec;
  s.n_threads = -3;
  EXPECT_NE(error_of(s).find("(got -3)"), std::string::npos);
  s = spec;
  s.n_batch = 0;
  EXPECT_EQ(error_of(s), "invalid_argument: n_batch must be >= 1 (got 0)");
  s = spec;
  s.agents[0].stop = {""};
  EXPECT_EQ(error_of(s),
            "invalid_argument: agent 'a': a stop string is empty (it would end every answer "
            "before its first token)");
  s = spec;
  s.agents[0].name = "a\xff";
  EXPECT_EQ(error_of(s),
            "invalid_argument: the name of agents[0] is not valid UTF-8 text on one line");
  s = spec;
  s.agents[0].prompt = std::string("q\0r", 3);
  EXPECT_EQ(error_of(s),
            "invalid_argument: agent 'a': the prompt contains a NUL byte at offset 1 (a binary "
            "file?)");
  s = spec;
  s.agents[0].sampling.temperature = std::numeric_limits<float>::infinity();
  EXPECT_EQ(error_of(s), "invalid_argument: agent 'a': need a finite temperature (got inf)");
}

TEST(EngineSettingsTest, InvalidCombinationsAreNamed) {
  const auto error_of = [](const PipelineSpec& spec) {
    try {
      validate_pipeline(spec);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PipelineSpec spec = four_agents();
  spec.n_ubatch = 513;
  EXPECT_EQ(error_of(spec),
            "invalid_argument: n_ubatch must be 0 (automatic) or divide n_batch 512 (got 513)");
  spec.n_ubatch = 384;  // micro-batches would start at 0, 384, 512, 896: not multiples of 384
  EXPECT_EQ(error_of(spec),
            "invalid_argument: n_ubatch must be 0 (automatic) or divide n_batch 512 (got 384)");
  spec.n_ubatch = 128;
  EXPECT_EQ(error_of(spec), "no error");
  spec = four_agents();
  spec.exact = false;  // exact turns flash attention on
  spec.flash_attn = false;
  spec.kv_type = KvType::kQ8_0;
  EXPECT_EQ(error_of(spec),
            "invalid_argument: kv_type q8_0 needs flash attention: at this llama.cpp a "
            "quantised V cache works only with flash_attn on");
  spec.flash_attn = true;
  EXPECT_EQ(error_of(spec), "no error");
  spec = four_agents();
  spec.n_threads_batch = -1;
  EXPECT_NE(error_of(spec).find("threads must be 0 (all cores) or 1.."), std::string::npos);
  EXPECT_NE(error_of(spec).find("(got -1)"), std::string::npos);
}

TEST(EngineSettingsTest, OnePipelineGivesEveryContextTheSameSettings) {
  PipelineSpec spec = four_agents();
  spec.n_batch = 256;
  spec.n_threads = 1;
  spec.n_threads_batch = 2;
  spec.flash_attn = true;
  spec.kv_type = KvType::kQ8_0;
  ContextOptions o = spec.context_options();
  EXPECT_EQ(o.n_batch, 256u);
  EXPECT_EQ(o.n_ubatch, 256u);                   // 0 = n_batch
  EXPECT_EQ(o.n_threads, effective_threads(1));  // resolved ($SWARMKV_MAX_THREADS caps them)
  EXPECT_EQ(o.n_threads_batch, effective_threads(2));
  EXPECT_TRUE(o.flash_attn);
  EXPECT_EQ(o.type_k, KvType::kQ8_0);
  EXPECT_EQ(o.type_v, KvType::kQ8_0);
  spec.n_ubatch = 128;
  EXPECT_EQ(spec.context_options().n_ubatch, 128u);
  // Automatic: 256 where it divides n_batch, else n_batch itself.
  spec.n_ubatch = 0;
  spec.n_batch = 512;
  EXPECT_EQ(spec.context_options().n_ubatch, 256u);
  spec.n_batch = 384;
  EXPECT_EQ(spec.context_options().n_ubatch, 384u);
  spec.n_batch = 64;
  EXPECT_EQ(spec.context_options().n_ubatch, 64u);
  // The context-level rule is the same one.
  o.flash_attn = false;
  try {
    validate_context_options(o);
    ADD_FAILURE() << "a q8_0 V cache without flash attention was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_type q8_0 needs flash attention"), std::string::npos);
  }
  o.type_v = KvType::kF16;  // a quantised K alone is fine without flash attention
  EXPECT_NO_THROW(validate_context_options(o));
}

// Exact mode is engine settings first: flash attention on, one-row steps
// on one thread unless our attention kernel is there, the batched ones
// on as many as before; and the model with batch-invariant kernels.
TEST(EngineSettingsTest, ExactModeTurnsOnFlashAttentionAndOneThreadOnlyWithoutTheAttentionKernel) {
  PipelineSpec spec = four_agents();
  spec.n_threads = 2;
  spec.exact = true;
  const ContextOptions o = spec.context_options();
  EXPECT_TRUE(o.flash_attn);
  EXPECT_EQ(o.n_threads, attention_batch_invariant() ? effective_threads(2) : 1);
  EXPECT_EQ(o.n_threads_batch, effective_threads(2));
  EXPECT_TRUE(spec.model_options().batch_invariant);
  spec.n_threads_batch = 1;
  EXPECT_EQ(spec.context_options().n_threads_batch, 1);
  spec.exact = false;
  EXPECT_EQ(spec.context_options().n_threads, effective_threads(2));
  EXPECT_FALSE(spec.context_options().flash_attn);
  EXPECT_FALSE(spec.model_options().batch_invariant);
  // q8_0 needs flash attention, which exact mode brings.
  spec.kv_type = KvType::kQ8_0;
  EXPECT_THROW(spec.validate(), Error);
  spec.exact = true;
  EXPECT_NO_THROW(spec.validate());
  // With the attention kernel any micro-batch is batch-invariant; without
  // it, 64 rows take ggml's tiled path.
  EXPECT_EQ(detail::branch_decoding(spec).max_rows, attention_batch_invariant() ? 0u : 63u);
  EXPECT_TRUE(detail::branch_decoding(spec).keep_cells);
  spec.exact = false;
  EXPECT_EQ(detail::branch_decoding(spec).max_rows, 0u);
  EXPECT_FALSE(detail::branch_decoding(spec).keep_cells);
}

// The K/V type left unset is q8_0 wherever flash attention runs (exact
// mode turns it on; bench/results/cluster-q8: half the bytes at f16's speed
// on the exact kernels), f16 where it does not (a quantised V cache needs
// it); one that is set is kept.
TEST(EngineSettingsTest, KvTypeDefaultsToQ8_0WhereFlashAttentionRuns) {
  PipelineSpec spec = four_agents();
  ASSERT_FALSE(spec.kv_type.has_value());
  ASSERT_TRUE(spec.exact);
  EXPECT_EQ(spec.context_options().type_k, KvType::kQ8_0);
  EXPECT_EQ(spec.context_options().type_v, KvType::kQ8_0);
  spec.exact = false;
  EXPECT_EQ(spec.context_options().type_k, KvType::kF16);
  EXPECT_EQ(spec.context_options().type_v, KvType::kF16);
  EXPECT_NO_THROW(spec.validate());
  spec.flash_attn = true;
  EXPECT_EQ(spec.context_options().type_v, KvType::kQ8_0);
  spec.exact = true;
  spec.kv_type = KvType::kF16;
  EXPECT_EQ(spec.context_options().type_k, KvType::kF16);
  EXPECT_EQ(spec.context_options().type_v, KvType::kF16);
}

TEST(EngineSettingsTest, WithoutTheAttentionKernelExactModeRunsOneRowStepsOnOneThread) {
  // The unit tests decode nothing, so ggml has not read the switch yet.
  const char* before = std::getenv("GGML_CPU_FA_BATCH_INVARIANT");
  const std::string saved = before != nullptr ? before : "";
  setenv("GGML_CPU_FA_BATCH_INVARIANT", "0", /*overwrite=*/1);
  PipelineSpec spec = four_agents();
  spec.n_threads = 2;
  spec.exact = true;
  EXPECT_FALSE(attention_batch_invariant());
  EXPECT_EQ(spec.context_options().n_threads, 1);
  EXPECT_EQ(detail::branch_decoding(spec).max_rows, 63u);
  if (before != nullptr) {
    setenv("GGML_CPU_FA_BATCH_INVARIANT", saved.c_str(), /*overwrite=*/1);
  } else {
    unsetenv("GGML_CPU_FA_BATCH_INVARIANT");
  }
}

TEST(EngineSettingsTest, KvTypesHaveStableNames) {
  EXPECT_EQ(to_string(KvType::kF16), "f16");
  EXPECT_EQ(to_string(KvType::kQ8_0), "q8_0");
  EXPECT_EQ(parse_kv_type("q8_0"), KvType::kQ8_0);
  try {
    parse_kv_type("q4_0");
    ADD_FAILURE() << "q4_0 was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "invalid_argument: unknown KV cache type 'q4_0' (known: f16, q8_0)");
  }
  ContextOptions o;
  o.n_batch = 64;
  o.n_ubatch = 32;
  o.n_threads_batch = 1;
  o.flash_attn = true;
  o.type_v = KvType::kQ8_0;
  PipelineResult r;
  r.engine = o;
  r.n_gpu_layers = 99;
  const nlohmann::json j = result_json(r)["engine"];
  EXPECT_EQ(j, nlohmann::json({{"flash_attn", true},
                               {"kv_type", "f16"},
                               {"n_batch", 64},
                               {"n_ubatch", 32},
                               {"threads", 0},
                               {"threads_batch", 1},
                               {"n_gpu_layers", 99},
                               {"offloaded_layers", 0}}));
}

}  // namespace
}  // namespace swarmkv
