#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "spec_fixtures.h"
#include "swarmkv/error.h"
#include "swarmkv/pipeline.h"

namespace swarmkv {
namespace {

class PipelineFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("swarmkv_pipeline_file_" +
            std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "doc.txt") << "The shared document.";
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name) << text;
    return (dir_ / name).string();
  }
  std::string error_of(const std::string& path) {
    try {
      load_pipeline_file(path);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }

  std::filesystem::path dir_;
};

TEST_F(PipelineFileTest, TheReadmePipelineLoads) {
  const PipelineSpec spec = load_pipeline_file(std::string(SWARMKV_SOURCE_DIR) +
                                               "/examples/pipelines/apache-license.yaml");
  EXPECT_EQ(spec.name, "apache-license-review");
  EXPECT_EQ(spec.fork, ForkMode::kShared);
  EXPECT_EQ(spec.n_ctx, 0u) << "omitted: sized automatically";
  ASSERT_GE(spec.agents.size(), 4u);
  EXPECT_NE(spec.document.find("Apache License"), std::string::npos);
  for (const AgentSpec& a : spec.agents) {
    EXPECT_FALSE(a.prompt.empty()) << a.name;
    EXPECT_EQ(a.max_tokens, 96) << "defaults apply to " << a.name;
    EXPECT_EQ(a.sampling.temperature, 0.0f);
    EXPECT_EQ(a.sampling.repeat_penalty, 1.1f) << "the README's repetition control";
    EXPECT_EQ(a.sampling.dry_multiplier, 0.8f);
  }
}

// The run page's 50-agent example: valid as written, every kind of edge.
TEST_F(PipelineFileTest, TheFiftyAgentExampleIsValidAndUsesEveryEdge) {
  const PipelineSpec spec =
      load_pipeline_file(std::string(SWARMKV_SOURCE_DIR) + "/examples/pipelines/fifty-agents.yaml");
  validate_pipeline(spec);
  ASSERT_EQ(spec.agents.size(), 50u);
  size_t depends = 0, forks = 0, needs = 0;
  for (const AgentSpec& a : spec.agents) {
    depends += a.depends_on.empty() ? 0 : 1;
    forks += a.fork_from.empty() ? 0 : 1;
    needs += a.needs.any() ? 1 : 0;
  }
  EXPECT_EQ(depends, 8u);
  EXPECT_EQ(forks, 2u);
  EXPECT_EQ(needs, 12u);
}

TEST_F(PipelineFileTest, AgentSettingsOverrideDefaultsAndPathsAreRelativeToTheFile) {
  const std::string path = write("p.yaml", R"(
name: t
n_ctx: 2048
fork: none
document: {file: doc.txt}
defaults: {max_tokens: 10, temperature: 0.5, stop: "END", repeat_penalty: 1.2, dry_multiplier: 0.5,
           logit_bias: {15: -100, 2: 2.5}}
agents:
  - {name: a, prompt: first}
  - {name: b, prompt: second, max_tokens: 3, temperature: 0, top_p: 0.9, top_k: 5, seed: 7, stop: [x, y], depends_on: a,
     min_p: 0.05, logit_bias: null,
     repeat_penalty: 1.05, repeat_last_n: 32, frequency_penalty: 0.1, presence_penalty: 0.2,
     dry_multiplier: 0.9, dry_base: 2, dry_allowed_length: 3, dry_penalty_last_n: 100}
)");
  const PipelineSpec spec = load_pipeline_file(path);
  EXPECT_EQ(spec.document, "The shared document.");
  EXPECT_EQ(spec.document_source, "file:" + (dir_ / "doc.txt").string());
  EXPECT_EQ(spec.fork, ForkMode::kNone);
  EXPECT_EQ(spec.n_ctx, 2048u);
  EXPECT_EQ(spec.agents[0].max_tokens, 10);
  EXPECT_EQ(spec.agents[0].sampling.temperature, 0.5f);
  EXPECT_EQ(spec.agents[0].stop, std::vector<std::string>{"END"});
  EXPECT_EQ(spec.agents[1].max_tokens, 3);
  EXPECT_EQ(spec.agents[1].sampling.top_k, 5);
  EXPECT_EQ(spec.agents[1].sampling.seed, 7u);
  EXPECT_EQ(spec.agents[0].sampling.repeat_penalty, 1.2f) << "from defaults";
  EXPECT_EQ(spec.agents[0].sampling.dry_multiplier, 0.5f);
  EXPECT_EQ(spec.agents[0].sampling.logit_bias,
            (std::vector<std::pair<Token, float>>{{2, 2.5f}, {15, -100.0f}}));
  const SamplingOptions& b = spec.agents[1].sampling;
  EXPECT_EQ(b.min_p, 0.05f);
  EXPECT_TRUE(b.logit_bias.empty()) << "null clears the default's";
  EXPECT_EQ(b.repeat_penalty, 1.05f);
  EXPECT_EQ(b.repeat_last_n, 32);
  EXPECT_EQ(b.frequency_penalty, 0.1f);
  EXPECT_EQ(b.presence_penalty, 0.2f);
  EXPECT_EQ(b.dry_multiplier, 0.9f);
  EXPECT_EQ(b.dry_base, 2.0f);
  EXPECT_EQ(b.dry_allowed_length, 3);
  EXPECT_EQ(b.dry_penalty_last_n, 100);
  EXPECT_EQ(spec.agents[1].stop, (std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(spec.agents[1].depends_on, std::vector<std::string>{"a"});
}

TEST_F(PipelineFileTest, EngineSettingsAreRead) {
  const PipelineSpec spec = load_pipeline_file(
      write("engine.yaml",
            "n_batch: 256\nn_ubatch: 128\nthreads: 1\nthreads_batch: 1\nflash_attn: true\n"
            "kv_type: q8_0\nn_gpu_layers: -1\ndocument: {text: x}\n"
            "agents: [{name: a, prompt: q}]\n"));
  EXPECT_EQ(spec.n_gpu_layers, -1);
  EXPECT_NE(
      error_of(write("gpu.yaml",
                     "n_gpu_layers: -2\ndocument: {text: x}\nagents: [{name: a, prompt: q}]\n"))
          .find("n_gpu_layers"),
      std::string::npos);
  EXPECT_EQ(spec.n_batch, 256u);
  EXPECT_EQ(spec.n_ubatch, 128u);
  EXPECT_EQ(spec.n_threads, 1);
  EXPECT_EQ(spec.n_threads_batch, 1);
  EXPECT_TRUE(spec.flash_attn);
  EXPECT_EQ(spec.kv_type, KvType::kQ8_0);
  const PipelineSpec off = load_pipeline_file(write(
      "off.yaml", "flash_attn: false\ndocument: {text: x}\nagents: [{name: a, prompt: q}]\n"));
  EXPECT_FALSE(off.flash_attn);
  EXPECT_FALSE(off.kv_type.has_value());  // EngineSettings::context_options decides
}

TEST_F(PipelineFileTest, JsonIsAcceptedToo) {
  const std::string path = write(
      "p.json", R"({"document": {"text": "inline"}, "agents": [{"name": "a", "prompt": "q"}]})");
  const PipelineSpec spec = load_pipeline_file(path);
  EXPECT_EQ(spec.document, "inline");
  EXPECT_EQ(spec.agents.size(), 1u);
}

// Python's json writes every character outside the BMP as a surrogate pair
// escape: a .json file is read as JSON, and the pair is one character.
TEST_F(PipelineFileTest, JsonSurrogatePairsReachTheTextAsTheirCharacters) {
  const std::string path = write("emoji.json", R"({"name": "p\ud83d\ude80",
    "system": "Be brief \ud83d\ude00", "document": {"text": "A doc \ud83d\udcc4 \u00e9"},
    "agents": [{"name": "a\ud83c\udf89", "prompt": "Say \ud83d\ude00", "stop": ["\ud83d\udc4b"],
                "needs": {"until": "\ud83d\udcc4"}}]})");
  const PipelineSpec spec = load_pipeline_file(path);
  EXPECT_EQ(spec.name, "p\U0001F680");
  EXPECT_EQ(spec.system_prompt, "Be brief \U0001F600");
  EXPECT_EQ(spec.document, "A doc \U0001F4C4 \u00e9");
  ASSERT_EQ(spec.agents.size(), 1u);
  EXPECT_EQ(spec.agents[0].name, "a\U0001F389");
  EXPECT_EQ(spec.agents[0].prompt, "Say \U0001F600");
  EXPECT_EQ(spec.agents[0].stop, std::vector<std::string>{"\U0001F44B"});
  EXPECT_EQ(spec.agents[0].needs.until, "\U0001F4C4");
  // What JSON itself refuses is named as JSON's error; mistakes name the key.
  const std::string lone = write("lone.json", R"({"document": "\ud83d", "agents": []})");
  EXPECT_NE(error_of(lone).find(lone + ": not JSON ("), std::string::npos) << error_of(lone);
  const std::string twice =
      write("twice.json",
            R"({"document": "x", "agents": [{"name": "a", "prompt": "q", "prompt": "r"}]})");
  EXPECT_EQ(error_of(twice), "invalid_argument: " + twice +
                                 ": not JSON (key 'prompt' is given twice in one object)");
  const std::string bad =
      write("bad.json",
            R"({"document": "x", "agents": [{"name": "a", "prompt": "q", "top_k": "many"}]})");
  EXPECT_EQ(error_of(bad), "invalid_argument: " + bad +
                               ": agents[0].top_k must be an integer, got the string \"many\"");
}

// One type check for YAML and JSON: a whole number is an integer however
// JSON writes it (1e1, 10.0), a quoted value is a string (never a number
// or a boolean), and a boolean is true or false (YAML 1.1's yes/on are not).
TEST_F(PipelineFileTest, TypesAreCheckedTheSameWayInYamlAndJson) {
  const std::string json_ok = write("ok.json", R"({"document": "x", "exact": false,
    "agents": [{"name": "a", "prompt": "q", "max_tokens": 1e1, "top_k": 20.0,
                "temperature": 5e-1}]})");
  const PipelineSpec from_json = load_pipeline_file(json_ok);
  EXPECT_EQ(from_json.agents[0].max_tokens, 10);
  EXPECT_EQ(from_json.agents[0].sampling.top_k, 20);
  EXPECT_FLOAT_EQ(from_json.agents[0].sampling.temperature, 0.5f);
  EXPECT_FALSE(from_json.exact);
  const PipelineSpec from_yaml = load_pipeline_file(
      write("ok.yaml",
            "document: x\nexact: False\nagents:\n  - {name: a, prompt: q, max_tokens: 1e1}\n"));
  EXPECT_EQ(from_yaml.agents[0].max_tokens, 10);
  EXPECT_FALSE(from_yaml.exact);

  const std::vector<std::pair<std::string, std::string>> refused = {
      {R"({"document": "x", "exact": "yes", "agents": [{"name": "a", "prompt": "q"}]})",
       "exact must be true or false, got the string \"yes\""},
      {R"({"document": "x", "exact": "true", "agents": [{"name": "a", "prompt": "q"}]})",
       "exact must be true or false, got the string \"true\""},
      {R"({"document": "x", "agents": [{"name": "a", "prompt": "q", "max_tokens": "10"}]})",
       "agents[0].max_tokens must be an integer, got the string \"10\""},
      {R"({"document": "x", "agents": [{"name": "a", "prompt": "q", "max_tokens": 10.5}]})",
       "agents[0].max_tokens must be an integer, got '10.5'"},
      {R"({"document": "x", "agents": [{"name": "a", "prompt": "q", "temperature": "0.5"}]})",
       "agents[0].temperature must be a number, got the string \"0.5\""},
  };
  for (size_t i = 0; i < refused.size(); ++i) {
    const std::string path = write(fmt::format("bad{}.json", i), refused[i].first);
    EXPECT_NE(error_of(path).find(refused[i].second), std::string::npos) << error_of(path);
  }
  const std::string yes =
      write("yes.yaml", "document: x\nexact: yes\nagents:\n  - {name: a, prompt: q}\n");
  EXPECT_NE(error_of(yes).find("exact must be true or false, got 'yes'"), std::string::npos)
      << error_of(yes);
}

TEST_F(PipelineFileTest, PlaceholdersPrioritiesAndMaxLiveAreRead) {
  const std::string ok = write("chain.yaml",
                               "max_live: 3\nexact: true\ndocument: {text: x}\nagents:\n"
                               "  - {name: a, prompt: q, priority: 2}\n"
                               "  - name: b\n    depends_on: a\n    prompt: \"{{a}} -- why?\"\n");
  const PipelineSpec spec = load_pipeline_file(ok);
  EXPECT_EQ(spec.max_live, 3);
  EXPECT_TRUE(spec.exact);
  EXPECT_EQ(spec.agents[0].priority, 2);
  EXPECT_EQ(spec.agents[1].priority, 0);
  EXPECT_EQ(spec.agents[1].prompt, "{{a}} -- why?");
  const std::string needs_ok = write("needs_ok.yaml",
                                     "document: {text: x y}\nagents:\n"
                                     "  - {name: a, prompt: q, needs: {tokens: 64}}\n"
                                     "  - {name: b, prompt: q, needs: {until: \"y\"}, "
                                     "fork_from: a}\n");
  EXPECT_NE(error_of(needs_ok).find("agent 'b': needs and fork_from do not combine"),
            std::string::npos)
      << error_of(needs_ok);
  const PipelineSpec read = load_pipeline_file(
      write("needs_read.yaml",
            "document: {text: x y}\nagents:\n  - {name: a, prompt: q, needs: {tokens: 64}}\n"
            "  - {name: b, prompt: q, needs: {until: \"y\"}}\n  - {name: c, prompt: r}\n"
            "  - {name: d, prompt: s, fork_from: c}\n"));
  EXPECT_EQ(read.agents[0].needs.tokens, 64);
  EXPECT_EQ(read.agents[1].needs.until, "y");
  EXPECT_FALSE(read.agents[2].needs.any());
  EXPECT_EQ(read.agents[3].fork_from, "c");
  const std::string needs = write("needs.yaml",
                                  "document: {text: x y}\nagents:\n"
                                  "  - {name: a, prompt: q, needs: {tokens: 64}}\n"
                                  "  - {name: b, prompt: q, needs: {until: \"y\"}}\n"
                                  "  - {name: c, prompt: q, needs: {lines: 3}}\n");
  EXPECT_NE(error_of(needs).find("unknown key 'lines' in agents[2].needs (line 5; allowed: "
                                 "tokens, until)"),
            std::string::npos)
      << error_of(needs);
  // Unquoted, YAML reads a mapping (or fails to parse): both errors say to quote.
  const std::string map = write("map.yaml",
                                "document: {text: x}\nagents:\n  - {name: a, prompt: q}\n"
                                "  - name: b\n    depends_on: a\n    prompt: {{a}}\n");
  EXPECT_EQ(error_of(map), "invalid_argument: " + map +
                               ": agents[1].prompt is a mapping, not text (line 6): in YAML a "
                               "value that starts with '{' is one; quote a prompt that starts "
                               "with a placeholder: prompt: \"{{name}} ...\"");
  const std::string broken = write("broken.yaml",
                                   "document: {text: x}\nagents:\n  - {name: a, prompt: q}\n"
                                   "  - name: b\n    depends_on: a\n    prompt: {{a}} why?\n");
  EXPECT_NE(error_of(broken).find("(a value that starts with '{{' must be quoted: prompt: "
                                  "\"{{name}} ...\")"),
            std::string::npos)
      << error_of(broken);
}

// The pipeline file's JSON is the one encoding of a spec (the cluster's job
// messages carry it): every field comes back, whatever its text holds.
TEST_F(PipelineFileTest, ASpecSurvivesItsPipelineJson) {
  for (const PipelineSpec& spec :
       {fixtures::spec_with_every_field_set(),
        fixtures::exact_variant(fixtures::spec_with_every_field_set())}) {
    const PipelineSpec back = parse_pipeline_json(pipeline_json(spec), "json", "/elsewhere");
    EXPECT_EQ(back, spec) << pipeline_json(back).dump(1);
    // Its text is YAML too (the same reader, from the other parser).
    EXPECT_EQ(parse_pipeline(pipeline_json(spec).dump(), "json", "/elsewhere"), spec);
  }
  // An empty model stays out (a worker's own model is used).
  PipelineSpec spec = fixtures::spec_with_every_field_set();
  spec.model.clear();
  EXPECT_FALSE(pipeline_json(spec).contains("model"));
  EXPECT_EQ(parse_pipeline(pipeline_json(spec).dump(), "json", "/elsewhere"), spec);
}

// A schema's properties are generated in the order they are written
// (reasoning before a verdict, say): that order survives a YAML file, a
// posted JSON body and the spec's JSON form that workers and posted runs
// get (it sorted the keys: a worker then generated in another order than
// the local run).
TEST_F(PipelineFileTest, ASchemaKeepsItsPropertiesOrderThroughEveryForm) {
  const std::string ordered =
      R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"boolean"}},)"
      R"("required":["zeta","alpha"]})";
  const PipelineSpec from_yaml = parse_pipeline(
      "document: x\nagents:\n  - name: a\n    prompt: q\n    json_schema:\n"
      "      type: object\n      properties: {zeta: {type: string}, alpha: {type: boolean}}\n"
      "      required: [zeta, alpha]\n",
      "yaml", "");
  EXPECT_EQ(from_yaml.agents[0].json_schema, ordered);
  const std::string body = R"({"document": "x", "agents": [{"name": "a", "prompt": "q",
      "json_schema": )" + ordered +
                           "}]}";
  const PipelineSpec from_json = parse_pipeline_json(read_pipeline_json(body, "body"), "body", "");
  EXPECT_EQ(from_json.agents[0].json_schema, ordered);
  // The spec's JSON, as a job message or a posted run carries it.
  const std::string wire = pipeline_json(from_yaml).dump();
  EXPECT_EQ(parse_pipeline_json(nlohmann::json::parse(wire), "job", "").agents[0].json_schema,
            ordered);
  EXPECT_EQ(parse_pipeline_json(read_pipeline_json(wire, "job"), "job", "").agents[0].json_schema,
            ordered);
  EXPECT_NE(error_of(write("s.json", R"({"document": "x", "agents": [{"name": "a", "prompt": "q",
      "json_schema": "[1]"}]})"))
                .find("agents[0].json_schema: a string must be a schema's JSON text, an object"),
            std::string::npos);
}

TEST_F(PipelineFileTest, StructuredAnswersAreReadAsSchemasAndGrammars) {
  write("level.json", R"({"type": "object", "properties": {"level": {"enum": ["low", "high"]}}})");
  write("yes.gbnf", "root ::= \"yes\" | \"no\"\n");
  const PipelineSpec spec = load_pipeline_file(write("s.yaml", R"(document: {text: x}
defaults:
  json_schema: {type: object, properties: {n: {type: integer, minimum: 0}}, required: [n]}
agents:
  - {name: inherits, prompt: q}
  - {name: file, prompt: q, json_schema: {file: level.json}}
  - {name: gbnf, prompt: q, grammar: {file: yes.gbnf}}
  - {name: inline, prompt: q, grammar: 'root ::= [0-9]+'}
  - {name: free, prompt: q, json_schema: null, stop: ["
"]}
)"));
  const auto& a = spec.agents;
  // Keys in the order written: a schema's properties are generated in it.
  const std::string n =
      R"({"type":"object","properties":{"n":{"type":"integer","minimum":0}},"required":["n"]})";
  EXPECT_EQ(a[0].json_schema, n);
  EXPECT_EQ(a[0].sampling.grammar, grammar_from_json_schema(n));
  EXPECT_EQ(a[1].json_schema,
            R"({"type":"object","properties":{"level":{"enum":["low","high"]}}})");
  EXPECT_EQ(a[1].sampling.grammar, grammar_from_json_schema(a[1].json_schema));
  EXPECT_EQ(a[2].json_schema, "");
  EXPECT_EQ(a[2].sampling.grammar, "root ::= \"yes\" | \"no\"\n");
  EXPECT_EQ(a[3].sampling.grammar, "root ::= [0-9]+");
  EXPECT_EQ(a[4].json_schema, "");
  EXPECT_EQ(a[4].sampling.grammar, "");
}

TEST_F(PipelineFileTest, TheContractFieldsExampleTakesFieldsOfItsSchemas) {
  const PipelineSpec spec = load_pipeline_file(std::string(SWARMKV_SOURCE_DIR) +
                                               "/examples/pipelines/contract-fields.yaml");
  ASSERT_EQ(spec.agents.size(), 4u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_FALSE(spec.agents[i].json_schema.empty()) << spec.agents[i].name;
    EXPECT_FALSE(spec.agents[i].sampling.grammar.empty()) << spec.agents[i].name;
  }
  EXPECT_EQ(resolve_placeholder(spec, "risks.risk_level")->field, ".risk_level");
}

TEST_F(PipelineFileTest, StructuredAnswerMistakesAreRefusedBeforeTheRun) {
  const auto agent = [&](const std::string& name, const std::string& keys) {
    return error_of(
        write(name, "document: {text: x}\nagents: [{name: a, prompt: q, " + keys + "}]\n"));
  };
  EXPECT_NE(agent("both.yaml", "json_schema: {type: string}, grammar: 'root ::= \"x\"'")
                .find("agents[0]: give either 'json_schema' or 'grammar', not both"),
            std::string::npos);
  EXPECT_NE(agent("stop.yaml", "json_schema: {type: string}, stop: [x]")
                .find("agent 'a': stop strings and a json_schema do not mix"),
            std::string::npos)
      << agent("stop.yaml", "json_schema: {type: string}, stop: [x]");
  const std::string ref = agent("ref.yaml", "json_schema: {$ref: 'https://example.com/x.json'}");
  EXPECT_NE(ref.find("agents[0].json_schema (line 2): llama.cpp's converter cannot make a grammar "
                     "of this JSON schema: "),
            std::string::npos)
      << ref;
  EXPECT_NE(ref.find("https://example.com/x.json"), std::string::npos) << ref;
  EXPECT_NE(agent("empty.yaml", "grammar: ' '").find("agents[0].grammar is empty"),
            std::string::npos);
  EXPECT_NE(agent("nojson.yaml", "json_schema: {file: doc.txt}").find("the file is not JSON"),
            std::string::npos);
}

// `tools:` makes an agent's answer a call: OpenAI's shape or the function
// alone, `tool_choice:` a name narrows them to one; the schema is the call's
// (parameters in their order) and the turn names the tools.
TEST_F(PipelineFileTest, ToolsMakeAnAgentsAnswerACall) {
  const PipelineSpec spec = load_pipeline_file(write("t.yaml", R"(document: {text: x}
agents:
  - name: any
    prompt: Flag the worst clause.
    tools:
      - type: function
        function:
          name: flag
          description: Flags a clause
          parameters: {type: object, properties: {zeta: {type: string}, alpha: {type: integer}}}
      - {name: noop}
  - name: named
    prompt: q
    tool_choice: noop
    tools: [{name: flag, parameters: {type: object}}, {name: noop}]
)"));
  const AgentSpec& any = spec.agents[0];
  ASSERT_EQ(any.tools.size(), 2u);
  EXPECT_EQ(any.tools[0].name, "flag");
  EXPECT_EQ(any.tools[0].description, "Flags a clause");
  EXPECT_EQ(
      any.tools[0].parameters,
      R"({"type":"object","properties":{"zeta":{"type":"string"},"alpha":{"type":"integer"}}})");
  EXPECT_EQ(any.tools[1].parameters, "{}");
  EXPECT_EQ(any.json_schema, tool_call_schema(any.tools));
  EXPECT_EQ(any.sampling.grammar, grammar_from_json_schema(any.json_schema));
  EXPECT_EQ(agent_turn(any, {}), "Flag the worst clause.\n\n" + tools_prompt(any.tools));
  ASSERT_EQ(spec.agents[1].tools.size(), 1u);
  EXPECT_EQ(spec.agents[1].tools[0].name, "noop");
  // The spec's JSON (workers, posted runs) carries them in order.
  EXPECT_EQ(parse_pipeline_json(pipeline_json(spec), "json", ""), spec);

  const auto agent = [&](const std::string& name, const std::string& keys) {
    return error_of(
        write(name, "document: {text: x}\nagents: [{name: a, prompt: q, " + keys + "}]\n"));
  };
  EXPECT_EQ(agent("none.yaml", "tools: [{name: f}], tool_choice: none"),
            "invalid_argument: " + (dir_ / "none.yaml").string() +
                ": agents[0].tool_choice: 'none' would make the tools pointless: leave 'tools' "
                "out for a text answer (line 2)");
  // auto: a call or text.
  const PipelineSpec automatic = load_pipeline_file(
      write("auto.yaml",
            "document: {text: x}\nagents: [{name: a, prompt: q, tools: [{name: f}], "
            "tool_choice: auto}]\n"));
  EXPECT_TRUE(automatic.agents[0].tool_or_text);
  EXPECT_EQ(automatic.agents[0].json_schema, tool_call_schema(automatic.agents[0].tools, true));
  EXPECT_EQ(agent_turn(automatic.agents[0], {}),
            "q\n\n" + tools_prompt(automatic.agents[0].tools, true));
  EXPECT_EQ(parse_pipeline_json(pipeline_json(automatic), "json", ""), automatic);
  EXPECT_FALSE(any.tool_or_text);
  EXPECT_NE(agent("unnamed.yaml", "tools: [{name: f}], tool_choice: g")
                .find("agents[0].tool_choice: no tool is named \"g\" (line 2)"),
            std::string::npos);
  EXPECT_NE(agent("alone.yaml", "tool_choice: required")
                .find("agents[0].tool_choice needs 'tools' (line 2)"),
            std::string::npos);
  EXPECT_NE(agent("both.yaml", "tools: [{name: f}], json_schema: {type: string}")
                .find("agents[0]: give 'tools' or 'json_schema', not both"),
            std::string::npos);
  EXPECT_NE(agent("name.yaml", "tools: [{name: 'a b'}]")
                .find("agents[0].tools[0].name: must be 1 to 64 of a-z, A-Z, 0-9, _ and - (got "
                      "\"a b\") (line 2)"),
            std::string::npos)
      << agent("name.yaml", "tools: [{name: 'a b'}]");
  EXPECT_NE(agent("twice.yaml", "tools: [{name: f}, {type: function, function: {name: f}}]")
                .find("agents[0].tools[1].function.name: names another tool's function too"),
            std::string::npos);
  EXPECT_NE(agent("params.yaml", "tools: [{name: f, parameters: [1]}]")
                .find("agents[0].tools[0].parameters: must be a JSON Schema object (got [1])"),
            std::string::npos);
  EXPECT_NE(agent("field.yaml", "tools: [{name: f, params: {}}]")
                .find("agents[0].tools[0].params: is not a function's field"),
            std::string::npos);
  // A placeholder takes the call's fields, checked against its schema.
  const std::string field = error_of(write("arg.yaml", R"(document: {text: x}
agents:
  - {name: a, prompt: q, tools: [{name: f, parameters: {type: object, properties: {n: {}}}}]}
  - {name: b, prompt: "{{a.arguments.m}}", depends_on: [a]}
)"));
  EXPECT_NE(field.find("agent 'b': placeholder {{a.arguments.m}}"), std::string::npos) << field;
  EXPECT_EQ(error_of(write("arg.yaml", R"(document: {text: x}
agents:
  - {name: a, prompt: q, tools: [{name: f, parameters: {type: object, properties: {n: {}}}}]}
  - {name: b, prompt: "{{a.arguments.n}} {{a.name}}", depends_on: [a]}
)")),
            "no error");
  EXPECT_NE(agent("empty.yaml", "tools: []").find("agents[0].tools is empty"), std::string::npos);
  EXPECT_NE(agent("stop.yaml", "tools: [{name: f}], stop: [x]")
                .find("agent 'a': stop strings and a json_schema do not mix"),
            std::string::npos);
  // A C++ caller that sets tools without their schema is told how.
  PipelineSpec bare = spec;
  bare.agents[1].json_schema.clear();
  EXPECT_THROW(
      {
        try {
          validate_pipeline(bare);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("set them with call_tools"), std::string::npos)
              << e.what();
          throw;
        }
      },
      Error);
}

TEST_F(PipelineFileTest, MistakesAreNamed) {
  EXPECT_EQ(error_of((dir_ / "missing.yaml").string()),
            "not_found: pipeline file '" + (dir_ / "missing.yaml").string() + "' does not exist");
  const std::string typo =
      write("typo.yaml", "document: {text: x}\nagents: [{name: a, prompt: q, max_token: 5}]\n");
  EXPECT_NE(error_of(typo).find("unknown key 'max_token' in agents[0]"), std::string::npos)
      << error_of(typo);
  const std::string bias = write(
      "bias.yaml", "document: {text: x}\nagents: [{name: a, prompt: q, logit_bias: {7: 101}}]\n");
  EXPECT_NE(error_of(bias).find("agents[0].logit_bias.7 must be in -100..100, got 101"),
            std::string::npos)
      << error_of(bias);
  const std::string bias_id = write(
      "biasid.yaml", "document: {text: x}\nagents: [{name: a, prompt: q, logit_bias: {x: 1}}]\n");
  EXPECT_NE(
      error_of(bias_id).find("agents[0].logit_bias.x: a key must be a token id (an integer >= 0)"),
      std::string::npos)
      << error_of(bias_id);
  const std::string no_doc = write("nodoc.yaml", "agents: [{name: a, prompt: q}]\n");
  EXPECT_NE(error_of(no_doc).find("missing 'document'"), std::string::npos);
  const std::string missing_doc =
      write("missingdoc.yaml", "document: {file: nope.txt}\nagents: [{name: a, prompt: q}]\n");
  EXPECT_EQ(error_of(missing_doc), "not_found: " + missing_doc + ": document file '" +
                                       (dir_ / "nope.txt").string() + "' does not exist");
  const std::string no_agents = write("noagents.yaml", "document: {text: x}\nagents: []\n");
  EXPECT_NE(error_of(no_agents).find("'agents' must be a non-empty list"), std::string::npos);
  const std::string bad_type = write(
      "badtype.yaml", "document: {text: x}\nagents: [{name: a, prompt: q, max_tokens: many}]\n");
  EXPECT_EQ(error_of(bad_type),
            "invalid_argument: " + bad_type +
                ": agents[0].max_tokens must be an integer, got 'many' (line 2)");
  const std::string bad_fork =
      write("badfork.yaml", "fork: gpu\ndocument: {text: x}\nagents: [{name: a, prompt: q}]\n");
  EXPECT_EQ(error_of(bad_fork), "invalid_argument: " + bad_fork +
                                    ": unknown fork mode 'gpu' (expected shared, host or none) "
                                    "(line 1)");
  const std::string bad_bool = write(
      "badbool.yaml", "flash_attn: maybe\ndocument: {text: x}\nagents: [{name: a, prompt: q}]\n");
  EXPECT_EQ(error_of(bad_bool), "invalid_argument: " + bad_bool +
                                    ": pipeline.flash_attn must be true or false, got 'maybe' "
                                    "(line 1)");
  const std::string bad_kv = write("badkv.yaml",
                                   "flash_attn: true\nkv_type: q2\ndocument: {text: x}\nagents: "
                                   "[{name: a, prompt: q}]\n");
  EXPECT_EQ(error_of(bad_kv), "invalid_argument: " + bad_kv +
                                  ": unknown KV cache type 'q2' (known: f16, q8_0) (line 2)");
  const std::string big_ubatch =
      write("bigubatch.yaml",
            "n_batch: 256\nn_ubatch: 512\ndocument: {text: x}\nagents: [{name: a, prompt: q}]\n");
  EXPECT_EQ(error_of(big_ubatch), "invalid_argument: " + big_ubatch +
                                      ": pipeline.n_ubatch must be in 0..256, got 512 (line 2)");
  const std::string q8_without_fa = write(
      "q8nofa.yaml",
      "exact: false\nflash_attn: false\nkv_type: q8_0\ndocument: {text: x}\nagents: [{name: a, "
      "prompt: q}]\n");
  EXPECT_EQ(error_of(q8_without_fa),
            "invalid_argument: " + q8_without_fa +
                ": kv_type q8_0 needs flash attention: at this llama.cpp a quantised V cache works "
                "only with flash_attn on");
  const std::string broken = write("broken.yaml", "document: [unclosed\n");
  EXPECT_NE(error_of(broken).find("not valid YAML"), std::string::npos);
}

}  // namespace
}  // namespace swarmkv
