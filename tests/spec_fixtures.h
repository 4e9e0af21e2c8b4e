// Specs and results with every field away from its default, for the round
// trips of their encodings (a field an encoder forgets fails the test).
#pragma once

#include <nlohmann/json.hpp>

#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv::fixtures {

// Every PipelineSpec, AgentSpec and SamplingOptions field set, text that
// YAML would read otherwise if it were not quoted, and both kinds of
// `needs`. Not exact: needs does not combine with it (exact_variant).
// The error `f` throws ({kInternal, "<no error>"} when it throws none).
template <class F>
ErrorValue error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.value();
  }
  return {ErrorCode::kInternal, "<no error>"};
}

inline PipelineSpec spec_with_every_field_set() {
  PipelineSpec spec;
  spec.name = "every-field";
  spec.document = "doc \xc3\xa9 \"quoted\"\n\ttab {{b}}: - [x] # not a comment\nSection 2: more\n";
  spec.document_source = "text";
  spec.system_prompt = "sys: yes";
  spec.model = "/models/m.gguf";
  spec.n_ctx = 4096;
  spec.n_batch = 256;
  spec.n_ubatch = 128;
  spec.n_threads = 1;
  spec.n_threads_batch = 1;
  spec.flash_attn = true;
  spec.kv_type = KvType::kQ8_0;
  spec.fork = ForkMode::kHost;
  spec.max_live = 3;
  spec.n_gpu_layers = 7;
  AgentSpec a;
  a.name = "a";
  a.prompt = "null";
  a.max_tokens = 7;
  a.sampling = {0.1f, 0.9f, 40,   0.05f, 4294967295u,
                1.1f, 32,   0.2f, -0.3f, 0.8f,
                1.5f, 3,    100,  "",    {{5, -1.5f}, {40, 100.0f}}};
  a.stop = {"\n\n", "END"};
  a.priority = -5;
  a.needs.tokens = 60;
  AgentSpec b = a;
  b.name = "b";
  b.prompt = "after {{ a }}: why?";
  b.depends_on = {"a"};
  b.priority = 2;
  b.needs = {0, "Section 2"};
  b.sampling.temperature = 0.7f;
  AgentSpec d;
  d.name = "d";
  d.prompt = "What is it?";
  // Strings that read as other scalars stay strings on the way through YAML.
  d.json_schema = nlohmann::json::parse(R"({"type": "object", "properties": {"level": {"enum":
      ["1", "true", null, 2.5, false, "null"]}}, "required": ["level"]})")
                      .dump();
  d.sampling.grammar = grammar_from_json_schema(d.json_schema);
  AgentSpec c;
  c.name = "c";
  c.prompt = "And then?";
  c.fork_from = "d";
  c.sampling.grammar = "root ::= \"yes\" | \"no\"\n";
  // Tools: the answer a call; parameters keep their order (zeta before alpha).
  AgentSpec e;
  e.name = "e";
  e.prompt = "Flag it.";
  call_tools(e,
             {{"flag", "Flags a clause",
               R"({"type":"object","properties":{"zeta":{"type":"string"},)"
               R"("alpha":{"enum":["1","true",null]}},"required":["zeta"]})"},
              {"noop", "", "{}"}},
             /*or_text=*/true);
  spec.agents = {a, b, d, c, e};
  return spec;
}

// The same, exact, without the watermarks exact refuses.
inline PipelineSpec exact_variant(PipelineSpec spec) {
  spec.exact = true;
  for (AgentSpec& a : spec.agents) a.needs = {};
  return spec;
}

// An ok result and a failed one with every AgentResult field set.
inline std::vector<AgentResult> results_with_every_field_set() {
  AgentResult ok;
  ok.name = "a";
  ok.answer = "x \xc3\xa9";
  ok.tokens = {5, 6, 7};
  ok.token_at_ms = {10.5, 11.25, 12};
  ok.prompt_rendered = "q?";
  ok.stop_reason = StopReason::kStopString;
  ok.prompt_tokens = 9;
  ok.timings_ms = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  ok.worker = "w1";
  ok.depends_on = {"up", "other"};
  ok.fork_from = "up";
  AgentResult failed = ok;
  failed.fork_from.clear();
  failed.needs.until = "Section 2";
  failed.name = "b";
  failed.status = NodeStatus::kFailed;
  failed.error = ErrorValue{ErrorCode::kNoKvSlot, "no slot"};
  failed.stop_reason = StopReason::kMaxTokens;  // not written for a failed agent
  AgentResult structured = ok;
  structured.name = "c";
  structured.answer = "{\"level\": \"low\", \"clauses\": [\"\xc3\xa9\", 2.5]}\n";
  structured.answer_is_json = true;
  structured.stop_reason = StopReason::kEndOfGeneration;
  return {ok, failed, structured};
}

}  // namespace swarmkv::fixtures
