// The OpenAI request parser, the pipeline request parser, the streamed text,
// the Host/Origin/Content-Type rules and the error map of `swarmkv serve`,
// without a model or a socket: each refusal names its field, in OpenAI's
// error shape.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "server/completion_engine.h"
#include "server/openai.h"
#include "server/pipeline_runner.h"
#include "server/request_guard.h"
#include "server/run_view.h"
#include "server/text_stream.h"
#include "swarmkv/result_json.h"
#include "swarmkv/run_page.h"

namespace swarmkv::server {
namespace {

using nlohmann::json;

ChatRequest parse(const std::string& body) {
  return parse_chat_request(body, RequestLimits{});
}

// The message of the Error(kInvalidArgument) parsing `body` throws (as a
// /v1/completions body where `text`).
std::string refusal(const std::string& body, bool text = false) {
  try {
    (void)(text ? parse_completion_request(body, RequestLimits{}) : parse(body));
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << body;
    return e.message();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

TEST(ChatRequestTest, AFullRequestIsReadFieldByField) {
  const ChatRequest r = parse(R"({
    "model": "m", "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi, "}, {"type": "text", "text": "you"}]},
      {"role": "assistant", "content": "Hello."},
      {"role": "developer", "content": "Now answer."}],
    "max_completion_tokens": 12, "temperature": 0, "top_p": 0.5, "seed": 7, "stop": ["\n\n", "END"],
    "n": 2, "frequency_penalty": 0.5, "presence_penalty": -1, "stream": true,
    "stream_options": {"include_usage": true}, "user": "ignored", "tools": []})");
  EXPECT_EQ(r.model, "m");
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[1].content, "Hi, you");
  EXPECT_EQ(r.messages[3].role, "system");  // OpenAI's "developer" is the system role
  EXPECT_EQ(r.max_tokens, 12);
  EXPECT_EQ(r.sampling.temperature, 0.0f);
  EXPECT_EQ(r.sampling.top_p, 0.5f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_EQ(r.sampling.frequency_penalty, 0.5f);
  EXPECT_EQ(r.sampling.presence_penalty, -1.0f);
  EXPECT_EQ(r.sampling.repeat_last_n, RequestLimits{}.max_tokens);  // the whole answer counts
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n\n", "END"}));
  EXPECT_EQ(r.n, 2);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
}

TEST(ChatRequestTest, DefaultsAreOpenAIs) {
  const ChatRequest r = parse(R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(r.max_tokens, 0);  // the server's default applies
  EXPECT_EQ(r.sampling.temperature, 1.0f);
  EXPECT_EQ(r.n, 1);
  EXPECT_FALSE(r.stream);
  EXPECT_FALSE(r.sampling.penalties_on());
}

TEST(ChatRequestTest, EachRefusalNamesItsField) {
  EXPECT_EQ(refusal(R"([1])"), "body: must be a JSON object (got [1])");
  EXPECT_EQ(refusal(R"({})"),
            "messages: must be a non-empty array of {\"role\", \"content\"} objects");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "robot", "content": "x"}]})"),
            "messages[0].role: must be system, user, assistant or tool (got \"robot\")");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user"}]})"),
            "messages[0].content: is missing (a string or an array of text parts)");
  EXPECT_EQ(
      refusal(
          R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})"),
      "messages[0].content[0]: must be {\"type\": \"text\", \"text\": ...}; only text is "
      "supported (got {\"image_url\":{},\"type\":\"image_url\"})");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "user", "content": "a\u0000b"}]})"),
            "messages[0].content contains a NUL byte at offset 1 (a binary file?)");
  const std::string m = R"({"messages": [{"role": "user", "content": "x"}], )";
  EXPECT_EQ(refusal(m + R"("max_tokens": 0})"), "max_tokens: must be in [1, 4096] (got 0)");
  EXPECT_EQ(refusal(m + R"("max_tokens": 1.5})"), "max_tokens: must be an integer (got 1.5)");
  EXPECT_EQ(refusal(m + R"("max_tokens": 1e5})"), "max_tokens: must be in [1, 4096] (got 100000)");
  EXPECT_EQ(parse(m + R"("max_tokens": 1e1, "n": 2.0})").max_tokens, 10);  // JSON's one number type
  EXPECT_EQ(refusal(m + R"("max_tokens": 3, "max_completion_tokens": 4})"),
            "max_completion_tokens: differs from max_tokens (4 vs 3); give one");
  EXPECT_EQ(refusal(m + R"("temperature": 3})"), "temperature: must be in [0, 2] (got 3)");
  EXPECT_EQ(refusal(m + R"("temperature": "hot"})"), "temperature: must be a number (got \"hot\")");
  EXPECT_EQ(refusal(m + R"("top_p": 0})"), "top_p: must be in (0, 1] (got 0)");
  EXPECT_EQ(refusal(m + R"("n": 9})"), "n: must be in [1, 8] (got 9)");
  EXPECT_EQ(refusal(m + R"("stop": ["a", 1]})"), "stop[1]: must be a string (got 1)");
  EXPECT_EQ(refusal(m + R"("stop": ""})"),
            "stop: an empty stop string would end every answer at once");
  EXPECT_EQ(refusal(m + R"("stop": ["a", "b", "c", "d", "e"]})"),
            "stop: at most 4 stop strings (got 5)");
  EXPECT_EQ(refusal(m + R"("stream": "yes"})"), "stream: must be true or false (got \"yes\")");
  EXPECT_EQ(refusal(m + R"("stream_options": {"include_usage": true}})"),
            "stream_options: is only allowed with \"stream\": true");
  EXPECT_EQ(refusal(m + R"("top_logprobs": 2})"), "top_logprobs: needs \"logprobs\": true");
  EXPECT_EQ(refusal(m + R"("logprobs": true, "top_logprobs": 21})"),
            "top_logprobs: must be in [0, 20] (got 21)");
  EXPECT_EQ(refusal(m + R"("response_format": {"type": "xml"}})"),
            "response_format: type must be text, json_object or json_schema (got "
            "{\"type\":\"xml\"})");
  EXPECT_EQ(refusal(m + R"("response_format": {"type": "json_schema", "json_schema": {}}})"),
            "response_format.json_schema: must be {\"name\": ..., \"schema\": {...}} (the "
            "schema is missing)");
  // What the converter cannot handle is refused by where it is.
  EXPECT_EQ(refusal(m + R"("response_format": {"type": "json_schema", "json_schema":
                {"name": "x", "schema": {"$ref": "https://example.com/s.json"}}}})")
                .rfind("response_format.json_schema.schema: llama.cpp's converter cannot make a "
                       "grammar of this JSON schema: ",
                       0),
            0u);
  const RequestLimits two{.max_messages = 2};
  EXPECT_THROW((void)parse_chat_request(R"({"messages": [{"role": "user", "content": "x"},
        {"role": "user", "content": "x"}, {"role": "user", "content": "x"}]})",
                                        two),
               Error);
}

// Every field is applied or refused by name; only OpenAI's meaningless
// ones (user, metadata, ...) are accepted without effect.
TEST(ChatRequestTest, FieldsAreAppliedOrRefusedNeverIgnored) {
  const std::string m = R"({"messages": [{"role": "user", "content": "x"}], )";
  const ChatRequest r = parse_chat_request(
      m + R"("top_k": 40, "repeat_penalty": 1.2, "min_p": 0.05, "logit_bias": {"7": -100,
      "12": 2.5}, "user": "u1", "store": false})",
      {});
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_EQ(r.sampling.repeat_penalty, 1.2f);
  EXPECT_TRUE(r.sampling.penalties_on());
  EXPECT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_EQ(r.sampling.logit_bias,
            (std::vector<std::pair<Token, float>>{{12, 2.5f}, {7, -100.0f}}));
  EXPECT_FALSE(r.seed_given);
  EXPECT_TRUE(parse_chat_request(m + R"("seed": 0})", {}).seed_given);
  EXPECT_EQ(refusal(m + R"("min_p": 1.5})"), "min_p: must be in [0, 1] (got 1.5)");
  EXPECT_EQ(refusal(m + R"("logit_bias": [1]})"),
            "logit_bias: must be an object of token id -> bias (got [1])");
  EXPECT_EQ(refusal(m + R"("logit_bias": {"x1": 1}})"),
            "logit_bias.\"x1\": keys must be token ids (non-negative integers as strings)");
  EXPECT_EQ(refusal(m + R"("logit_bias": {"5": 101}})"),
            "logit_bias.5: must be in [-100, 100] (got 101)");
  EXPECT_EQ(refusal(m + R"("logit_bias": {"5": "up"}})"),
            "logit_bias.5: must be a number (got \"up\")");
  EXPECT_EQ(parse(m + R"("logprobs": true, "top_logprobs": 5})").sampling.top_logprobs, 5);
  EXPECT_EQ(parse(m + R"("logprobs": true})").sampling.top_logprobs, 0);
  EXPECT_EQ(parse(m + R"("logprobs": false})").sampling.top_logprobs, -1);
  for (const char* field : {"grammar", "echo", "suffix", "typo"}) {
    EXPECT_EQ(refusal(m + "\"" + field + "\": 1}"),
              std::string(field) +
                  ": is not supported by swarmkv serve (docs/serve.md lists the fields it takes)");
  }
  EXPECT_EQ(refusal(m + R"("top_k": -1})"), "top_k: must be in [0, 1048576] (got -1)");
  EXPECT_EQ(refusal(m + R"("repeat_penalty": 0})"), "repeat_penalty: must be in (0, 10] (got 0)");
}

// The completions endpoint's logprobs: the answer's tokens from the
// prompt's end, or with echo the prompt's tokens first from offset 0, a
// first token with nothing before it null.
// An echoed prompt's steps hold at most 128 MiB of logits: SmolLM2's
// vocabulary a whole step, Gemma 3's 128 rows, never fewer than 16 or more
// than the step.
TEST(CompletionLogprobsTest, ScoredStepsHoldABoundedNumberOfLogitRows) {
  EXPECT_EQ(scored_rows_per_step(49152, 512), 512);
  EXPECT_EQ(scored_rows_per_step(262144, 512), 128);
  EXPECT_EQ(scored_rows_per_step(262144, 64), 64);
  EXPECT_EQ(scored_rows_per_step(1 << 24, 512), 16);
  EXPECT_EQ(scored_rows_per_step(1 << 24, 8), 8);
}

TEST(CompletionLogprobsTest, EchoedPromptTokensComeFirstFromOffsetZero) {
  const auto scored = [](Token t, std::string text, float lp) {
    SampledLogprobs s;
    s.sampled = {t, lp, std::move(text)};
    s.top = {{t, lp, s.sampled.text}, {9, lp - 1, "z"}};
    return s;
  };
  const std::vector<SampledLogprobs> answer = {scored(5, " c", -0.5f)};
  const json plain = completion_logprobs_json(answer, 4, true);
  EXPECT_EQ(plain["tokens"], json({" c"}));
  EXPECT_EQ(plain["text_offset"], json({4}));
  const std::vector<SampledLogprobs> prompt = {scored(3, " b", -2.0f)};
  PromptLogprobs first_unscored{.unscored = "aa", .scored = prompt};
  const json echoed = completion_logprobs_json(answer, 4, true, &first_unscored);
  EXPECT_EQ(echoed["tokens"], json({"aa", " b", " c"}));
  EXPECT_EQ(echoed["token_logprobs"], json({nullptr, -2.0, -0.5}));
  EXPECT_EQ(echoed["text_offset"], json({0, 2, 4}));
  EXPECT_EQ(echoed["top_logprobs"][0], nullptr);
  EXPECT_EQ(echoed["top_logprobs"][1], json({{" b", -2.0}, {"z", -3.0}}));
  // After a BOS every listed token has a logprob; without top, no tops.
  PromptLogprobs after_bos{.unscored = std::nullopt, .scored = prompt};
  const json bos = completion_logprobs_json(answer, 2, false, &after_bos);
  EXPECT_EQ(bos["token_logprobs"], json({-2.0, -0.5}));
  EXPECT_EQ(bos["text_offset"], json({0, 2}));
  EXPECT_EQ(bos["top_logprobs"], nullptr);
}

TEST(ChatRequestTest, JsonResponseFormatsBecomeTheAnswersGrammar) {
  const std::string m = R"({"messages": [{"role": "user", "content": "x"}], )";
  EXPECT_EQ(parse_chat_request(m + R"("response_format": {"type": "text"}})", {}).sampling.grammar,
            "");
  const std::string object =
      parse_chat_request(m + R"("response_format": {"type": "json_object"}})", {}).sampling.grammar;
  EXPECT_EQ(object, grammar_from_json_schema(R"({"type": "object"})"));
  const std::string schema = R"({"type": "object", "properties": {"level": {"enum": ["low",
      "high"]}}, "required": ["level"]})";
  const ChatRequest r = parse_chat_request(
      m + R"("response_format": {"type": "json_schema", "json_schema": {"name": "risk", "strict":
      true, "schema": )" +
          schema + "}}}",
      {});
  EXPECT_EQ(r.sampling.grammar, grammar_from_json_schema(schema));
  EXPECT_NE(r.sampling.grammar.find("\"\\\"low\\\"\""), std::string::npos) << r.sampling.grammar;
  EXPECT_NE(r.sampling.grammar, object);
}

// tool_choice "required" or a named function makes the answer a call: the
// grammar of {"name", "arguments"} over the offered schemas and a system
// prompt naming them; "auto" lets it answer in text instead; the legacy
// "functions" are refused by name;
// a conversation's earlier calls and their results are read.
TEST(ChatRequestTest, ToolsMakeTheAnswerACallOfTheChosenOnes) {
  const std::string tools = R"("tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather now",
       "parameters": {"type": "object", "properties": {"zeta": {"type": "string"},
       "alpha": {"type": "integer"}}, "required": ["zeta"]}}},
      {"type": "function", "function": {"name": "noop"}}])";
  const std::string m = R"({"messages": [{"role": "user", "content": "x"}], )" + tools;
  const ChatRequest all = parse_chat_request(m + R"(, "tool_choice": "required"})", {});
  ASSERT_EQ(all.tools.size(), 2u);
  EXPECT_EQ(all.sampling.grammar, grammar_from_json_schema(tool_call_schema(all.tools)));
  // The client's order of properties is the order they are sampled in.
  const std::string schema = tool_call_schema(all.tools);
  EXPECT_LT(schema.find("zeta"), schema.find("alpha")) << schema;
  EXPECT_LT(schema.find("\"name\""), schema.find("\"arguments\"")) << schema;
  ASSERT_EQ(all.messages.size(), 2u);
  EXPECT_EQ(all.messages[0].role, "system");
  EXPECT_EQ(all.messages[0].content, tools_prompt(all.tools));
  EXPECT_NE(all.messages[0].content.find("Weather now"), std::string::npos);

  const ChatRequest named = parse_chat_request(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content":
      "x"}], )" +
          tools + R"(, "tool_choice": {"type": "function", "function": {"name": "noop"}}})",
      {});
  ASSERT_EQ(named.tools.size(), 1u);
  EXPECT_EQ(named.tools[0].name, "noop");
  EXPECT_EQ(named.messages[0].content, "Be brief.\n\n" + tools_prompt(named.tools));
  EXPECT_TRUE(parse_chat_request(m + R"(, "tool_choice": "none"})", {}).tools.empty());
  EXPECT_TRUE(parse_chat_request(m + R"(, "tool_choice": "none"})", {}).sampling.grammar.empty());

  // "auto", the default with tools: a call or text, {"response": ...}.
  for (const std::string& body : {m + "}", m + R"x(, "tool_choice": "auto"})x"}) {
    const ChatRequest automatic = parse_chat_request(body, {});
    EXPECT_TRUE(automatic.tool_or_text);
    ASSERT_EQ(automatic.tools.size(), 2u);
    EXPECT_EQ(automatic.sampling.grammar,
              grammar_from_json_schema(tool_call_schema(automatic.tools, true)));
    EXPECT_EQ(automatic.messages[0].content, tools_prompt(automatic.tools, true));
  }
  EXPECT_FALSE(all.tool_or_text);
  EXPECT_NE(tool_call_schema(all.tools, true).find(R"("response":{"type":"string"})"),
            std::string::npos);
  EXPECT_EQ(tool_call_schema(all.tools).find("response"), std::string::npos);
  EXPECT_EQ(refusal(m + R"(, "tool_choice": {"type": "function", "function": {"name": "x"}}})"),
            "tool_choice.function.name: no tool is named \"x\"");
  EXPECT_EQ(refusal(m + R"(, "tool_choice": "required", "response_format": {"type":
      "json_object"}})"),
            "response_format: cannot be combined with a tool call (tool_choice makes the answer a "
            "call)");
  const std::string u = R"({"messages": [{"role": "user", "content": "x"}], )";
  EXPECT_EQ(refusal(u + R"("tool_choice": "required"})"),
            "tool_choice: \"required\" needs \"tools\"");
  EXPECT_EQ(refusal(u + R"("tools": [{"type": "function"}], "tool_choice": "required"})"),
            "tools[0]: must be {\"type\": \"function\", \"function\": {...}} (got "
            "{\"type\":\"function\"})");
  EXPECT_EQ(refusal(u + R"("tools": [{"type": "function", "function": {"name": "a b"}}]})"),
            "tools[0].function.name: must be 1 to 64 of a-z, A-Z, 0-9, _ and - (got \"a b\")");
  EXPECT_EQ(refusal(u + R"("functions": [], "function_call": "auto"})"),
            "function_call: is OpenAI's legacy form of tool calls; send \"tools\" and "
            "\"tool_choice\"");

  // An earlier call and its result, as the model sees them.
  const ChatRequest turn = parse_chat_request(
      R"({"messages": [{"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"zeta\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}]})",
      {});
  ASSERT_EQ(turn.messages.size(), 3u);
  EXPECT_EQ(turn.messages[1].role, "assistant");
  EXPECT_EQ(turn.messages[1].content, R"({"arguments":{"zeta":"Oslo"},"name":"get_weather"})");
  EXPECT_EQ(turn.messages[2].role, "user");
  EXPECT_EQ(turn.messages[2].content, "The tool call c1 returned:\n-3 C");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "tool", "content": "-3 C"}]})"),
            "messages[0].tool_call_id: is missing (the id of the call this message answers)");
  EXPECT_EQ(refusal(R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "c1", "type":
      "function", "function": {"name": "f", "arguments": "{"}}]}]})"),
            "messages[0].tool_calls[0].function.arguments: must be JSON text (the call's "
            "arguments object)");
}

TEST(ChatRequestTest, AnAnswerUnderTheCallGrammarBecomesOpenAIsToolCalls) {
  const json calls =
      tool_calls_of(R"({"name": "get_weather", "arguments": {"zeta": "Oslo"}})", "c7");
  EXPECT_EQ(calls, json::parse(R"([{"id": "c7", "type": "function", "function": {"name":
      "get_weather", "arguments": "{\"zeta\":\"Oslo\"}"}}])"));
  // The arguments keep the order they were generated in (the schema's).
  EXPECT_EQ(tool_calls_of(R"({"name": "f", "arguments": {"zeta": 1, "alpha": 2}})",
                          "c8")[0]["function"]["arguments"],
            R"({"zeta":1,"alpha":2})");
  EXPECT_THROW((void)tool_calls_of(R"({"name": "get_weather")", "c7"), Error);
  EXPECT_THROW((void)tool_calls_of(R"({"arguments": {}})", "c7"), Error);
  // Under "auto" an answer may be text instead.
  EXPECT_EQ(response_of(R"({"response": "It is sunny."})"), "It is sunny.");
  EXPECT_EQ(response_of(R"({"name": "f", "arguments": {}})"), std::nullopt);
  EXPECT_EQ(response_of(R"({"response": 3})"), std::nullopt);
  EXPECT_EQ(response_of("not json"), std::nullopt);
}

// POST /v1/completions: a prompt continued as written, the sampling fields
// read as chat's, OpenAI's legacy logprobs (an integer) and default of 16
// tokens; several prompts, n choices each; echo; what it cannot do (suffix,
// ranking best_of) refused by name.
TEST(CompletionRequestTest, APromptIsReadAndWhatCannotBeDoneIsRefusedByName) {
  const ChatRequest r = parse_completion_request(
      R"({"model": "m", "prompt": "Once", "temperature": 0.5, "seed": 7, "n": 2, "best_of": 2,
          "logprobs": 3, "stop": "\n", "stream": true, "echo": false, "suffix": null,
          "user": "u"})",
      RequestLimits{});
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.prompts, std::vector<std::string>{"Once"});
  EXPECT_EQ(r.choices(), 2);
  EXPECT_EQ(r.model, "m");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_EQ(r.sampling.seed, 7u);
  EXPECT_TRUE(r.seed_given);
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.sampling.top_logprobs, 3);
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n"});
  EXPECT_TRUE(r.stream);
  EXPECT_EQ(r.max_tokens, 16);  // OpenAI's default here
  EXPECT_TRUE(r.messages.empty());
  EXPECT_FALSE(r.echo);
  const ChatRequest one = parse_completion_request(R"({"prompt": ["Twice"]})", RequestLimits{});
  EXPECT_EQ(one.prompts, std::vector<std::string>{"Twice"});
  EXPECT_EQ(one.sampling.top_logprobs, -1);
  EXPECT_FALSE(one.echo);
  EXPECT_TRUE(parse_completion_request(R"({"prompt": "a", "echo": true})", RequestLimits{}).echo);
  // max_tokens 0 only with echo: the prompt alone.
  const ChatRequest scoring = parse_completion_request(
      R"({"prompt": "a", "echo": true, "max_tokens": 0, "logprobs": 1})", RequestLimits{});
  EXPECT_TRUE(scoring.prompt_only);
  EXPECT_EQ(scoring.max_tokens, 0);
  EXPECT_FALSE(r.prompt_only);
  EXPECT_EQ(refusal(R"({"prompt": "a", "max_tokens": 0})", true),
            "max_tokens: must be in [1, 4096] (got 0); 0 only with echo: the prompt alone, scored "
            "with logprobs");
  const ChatRequest three =
      parse_completion_request(R"({"prompt": ["A", "B", "C"], "n": 2})", RequestLimits{});
  EXPECT_EQ(three.prompts, (std::vector<std::string>{"A", "B", "C"}));
  EXPECT_EQ(three.choices(), 6);
  EXPECT_EQ(refusal(R"({"prompt": ["a", ""]})", true), "prompt[1]: is empty");
  const std::string kShapes =
      "prompt: must be a string, a list of strings, a list of token ids or a list of lists of "
      "token ids ";
  EXPECT_EQ(refusal(R"({"prompt": []})", true), kShapes + "(got [])");
  // Token ids, as OpenAI takes them: one prompt's, or a list of prompts'.
  const ChatRequest ids = parse_completion_request(R"({"prompt": [1, 2, 3]})", RequestLimits{});
  EXPECT_TRUE(ids.prompts.empty());
  EXPECT_EQ(ids.prompt_tokens, (std::vector<std::vector<Token>>{{1, 2, 3}}));
  EXPECT_EQ(ids.choices(), 1);
  const ChatRequest lists =
      parse_completion_request(R"({"prompt": [[1], [4, 5]], "n": 2})", RequestLimits{});
  EXPECT_EQ(lists.prompt_tokens, (std::vector<std::vector<Token>>{{1}, {4, 5}}));
  EXPECT_EQ(lists.choices(), 4);
  EXPECT_EQ(refusal(R"({"prompt": [1, -2]})", true),
            "prompt[1]: must be a token id (a non-negative integer; got -2)");
  EXPECT_EQ(refusal(R"({"prompt": [1, "a"]})", true),
            "prompt[1]: must be a token id (a non-negative integer; got \"a\")");
  EXPECT_EQ(refusal(R"({"prompt": [1.5]})", true),
            "prompt[0]: must be a token id (a non-negative integer; got 1.5)");
  EXPECT_EQ(refusal(R"({"prompt": [[1], []]})", true), "prompt[1]: is empty");
  EXPECT_EQ(refusal(R"({"prompt": [[1], [2, 4294967296]]})", true),
            "prompt[1][1]: must be a token id (a non-negative integer; got 4294967296)");
  EXPECT_EQ(refusal(R"({"prompt": [[1], "a"]})", true),
            "prompt[1]: must be a list of token ids like the first (got \"a\")");
  EXPECT_EQ(refusal(R"({"prompt": ["a", [1]]})", true),
            "prompt[1]: must be a string like the first (got [1])");
  RequestLimits two;
  two.max_prompts = 2;
  try {
    (void)parse_completion_request(R"({"prompt": ["a", "b", "c"]})", two);
    ADD_FAILURE() << "three prompts over a limit of two were taken";
  } catch (const Error& e) {
    EXPECT_EQ(e.value().message, "prompt: has 3 prompts; at most 2 per request");
  }
  EXPECT_EQ(refusal(R"({})", true), "prompt: is missing (a string)");
  EXPECT_EQ(refusal(R"({"prompt": ""})", true), "prompt: is empty");
  EXPECT_EQ(refusal(R"({"prompt": 5})", true), kShapes + "(got 5)");
  EXPECT_EQ(refusal(R"({"prompt": "a", "echo": 1})", true), "echo: must be true or false (got 1)");
  EXPECT_EQ(refusal(R"({"prompt": "a", "suffix": "b"})", true),
            "suffix: is not supported (no fill-in-the-middle)");
  EXPECT_EQ(refusal(R"({"prompt": "a", "best_of": 3})", true),
            "best_of: must equal n (1): answers are not ranked");
  EXPECT_EQ(refusal(R"({"prompt": "a", "logprobs": 6})", true),
            "logprobs: must be in [0, 5] (got 6)");
  EXPECT_EQ(refusal(R"({"prompt": "a", "messages": []})", true),
            "messages: is not supported by swarmkv serve (docs/serve.md lists the fields it "
            "takes)");
  EXPECT_EQ(refusal(R"({"prompt": "a", "response_format": {"type": "json_object"}})", true),
            "response_format: is not supported by swarmkv serve (docs/serve.md lists the "
            "fields it takes)");
}

TEST(ChatRequestTest, NotJsonIsRefusedWithThePosition) {
  const std::string m = refusal(R"({"messages": )");
  EXPECT_EQ(m.rfind("body: not JSON ([json.exception.parse_error.101] parse error at line 1, "
                    "column 14",
                    0),
            0u)
      << m;
  // Invalid UTF-8 is not JSON either.
  EXPECT_EQ(refusal("{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}")
                .rfind("body: not JSON", 0),
            0u);
}

TEST(OpenAIErrorTest, CodesMapToStatusesInOnePlace) {
  EXPECT_EQ(http_error(ErrorCode::kInvalidArgument).status, 400);
  EXPECT_EQ(http_error(ErrorCode::kBudget).status, 400);
  EXPECT_EQ(http_error(ErrorCode::kChatTemplate).status, 400);
  EXPECT_EQ(http_error(ErrorCode::kNotFound).status, 404);
  EXPECT_EQ(http_error(ErrorCode::kNoKvSlot).status, 503);
  EXPECT_EQ(http_error(ErrorCode::kAborted).status, 503);
  EXPECT_EQ(http_error(ErrorCode::kDecodeFatal).status, 500);
  EXPECT_EQ(http_error(ErrorCode::kInternal).type, "server_error");
}

TEST(OpenAIErrorTest, TheBodyHasOpenAIsShapeAndNamesTheParam) {
  const nlohmann::json j = error_body({ErrorCode::kInvalidArgument,
                                       "messages[0].role: must be system, user or "
                                       "assistant (got \"tool\")"},
                                      http_error(ErrorCode::kInvalidArgument));
  EXPECT_EQ(j, nlohmann::json::parse(R"js({"error": {
    "message": "messages[0].role: must be system, user or assistant (got \"tool\")",
    "type": "invalid_request_error", "param": "messages[0].role", "code": "invalid_argument"}})js"));
  const nlohmann::json budget =
      error_body({ErrorCode::kBudget, "prompt_tokens 9 + max_tokens 9 = 18 > n_ctx 16"},
                 http_error(ErrorCode::kBudget));
  EXPECT_EQ(budget["error"]["param"], nullptr);
  EXPECT_EQ(budget["error"]["code"], "context_length_exceeded");
  EXPECT_EQ(param_of("body: not JSON"), "");
  EXPECT_EQ(param_of("stop[1]: must be a string (got 1)"), "stop[1]");
}

TEST(OpenAIErrorTest, FinishReasons) {
  EXPECT_EQ(finish_reason(StopReason::kMaxTokens), "length");
  EXPECT_EQ(finish_reason(StopReason::kEndOfGeneration), "stop");
  EXPECT_EQ(finish_reason(StopReason::kStopString), "stop");
}

// ------------------------------------------------------------------ Host, Origin, Content-Type

// The code of the guard's refusal of these headers, "" when it lets them in.
std::string guard_code(const RequestGuard& guard, std::string_view host, std::string_view origin,
                       std::string_view local = "127.0.0.1") {
  const std::optional<Refusal> r = guard.check(host, origin, local);
  return r ? r->code : "";
}

// DNS rebinding: a page's own name pointed at this server; its requests
// still carry that name. Only the server's names and addresses pass.
TEST(RequestGuardTest, AHostMustNameThisServer) {
  const RequestGuard loopback("127.0.0.1", {}, {});
  for (const char* host : {"127.0.0.1:8080", "127.0.0.1", "localhost:8080", "LOCALHOST",
                           "localhost.", "[::1]:8080", "127.0.0.2:8080", ""}) {
    EXPECT_EQ(guard_code(loopback, host, ""), "") << host;
  }
  for (const char* host : {"evil.example:8080", "evil.example", "127.0.0.1.evil.example",
                           "localhost.evil.example:8080", "10.0.0.5:8080", ":8080", "[::1"}) {
    EXPECT_EQ(guard_code(loopback, host, ""), "forbidden_host") << host;
  }
  // Bound to every interface: the address a connection arrived at is the
  // server's (IPv4 also as an IPv6-mapped one); --host's name and
  // --allow-host's names are too.
  const RequestGuard all("0.0.0.0", {"Proxy.Example"}, {});
  EXPECT_EQ(guard_code(all, "10.0.0.5:8080", "", "10.0.0.5"), "");
  EXPECT_EQ(guard_code(all, "10.0.0.5:8080", "", "::ffff:10.0.0.5"), "");
  EXPECT_EQ(guard_code(all, "10.0.0.6:8080", "", "10.0.0.5"), "forbidden_host");
  EXPECT_EQ(guard_code(all, "proxy.example", "", "10.0.0.5"), "");
  EXPECT_EQ(guard_code(all, "other.example", "", "10.0.0.5"), "forbidden_host");
  EXPECT_EQ(guard_code(RequestGuard("box.lan", {}, {}), "BOX.lan:8080", ""), "");
  const std::optional<Refusal> r = loopback.check("evil.example:8080", "", "127.0.0.1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message,
            "Host 'evil.example:8080' is not this server's name or address: a page whose DNS name "
            "was pointed at this server (DNS rebinding) must not use it or read its runs; serve "
            "with --allow-host evil.example to answer to that name");
}

// A page on another site may POST here without asking first; the browser
// says where it comes from. Only this server's own origin (and those
// allowed) pass; a client that sends none (curl, the OpenAI clients) too.
TEST(RequestGuardTest, AnOriginMustBeThisServersOwn) {
  const RequestGuard guard("127.0.0.1", {}, {"https://App.Example/"});
  EXPECT_EQ(guard_code(guard, "127.0.0.1:8080", "http://127.0.0.1:8080"), "");
  EXPECT_EQ(guard_code(guard, "localhost:8080", "http://LOCALHOST:8080"), "");
  EXPECT_EQ(guard_code(guard, "127.0.0.1:8080", "https://app.example"), "");
  for (const char* origin :
       {"http://evil.example", "http://127.0.0.1:8081", "http://localhost:8080", "null",
        "https://app.example:444", "file://"}) {
    EXPECT_EQ(guard_code(guard, "127.0.0.1:8080", origin), "forbidden_origin") << origin;
  }
  EXPECT_EQ(guard_code(guard, "", "http://127.0.0.1:8080"), "forbidden_origin");
  const std::optional<Refusal> r =
      guard.check("127.0.0.1:8080", "http://evil.example", "127.0.0.1");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->message,
            "Origin 'http://evil.example' is not this server ('127.0.0.1:8080'): a page on another "
            "site must not use it; serve with --allow-origin http://evil.example to let that site "
            "in");
}

// Only JSON is read: text/plain and forms are what a page elsewhere sends
// without a preflight.
TEST(RequestGuardTest, OnlyAJsonContentTypeIsJson) {
  for (const char* type : {"application/json", "application/json; charset=utf-8",
                           "Application/JSON", " application/json ;charset=UTF-8"}) {
    EXPECT_TRUE(is_json_content_type(type)) << type;
  }
  for (const char* type :
       {"", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
        "application/jsonx", "text/plain; application/json"}) {
    EXPECT_FALSE(is_json_content_type(type)) << type;
  }
}

// ------------------------------------------------------------------ /v1/pipelines

std::string pipeline_refusal(const std::string& body, const PipelineLimits& limits = {},
                             ErrorCode code = ErrorCode::kInvalidArgument) {
  try {
    (void)parse_pipeline_request(body, limits);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << body;
    return e.message();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

constexpr const char* kPipeline = R"({"name": "p", "document": {"text": "The licence."},
  "fork": "host", "defaults": {"max_tokens": 9},
  "agents": [{"name": "a", "prompt": "Who?"}, {"name": "b", "prompt": "{{a}}?", "depends_on": "a",
              "max_tokens": 4, "stop": ["\n"]}]})";

TEST(PipelineRequestTest, APipelineFilesJsonIsReadAsOne) {
  const PipelineSpec spec = parse_pipeline_request(kPipeline, {});
  EXPECT_EQ(spec.name, "p");
  EXPECT_EQ(spec.document, "The licence.");
  EXPECT_EQ(spec.document_source, "text");
  EXPECT_EQ(spec.fork, ForkMode::kHost);
  EXPECT_TRUE(spec.model.empty());
  ASSERT_EQ(spec.agents.size(), 2u);
  EXPECT_EQ(spec.agents[0].max_tokens, 9);
  EXPECT_EQ(spec.agents[1].max_tokens, 4);
  EXPECT_EQ(spec.agents[1].depends_on, std::vector<std::string>{"a"});
  EXPECT_EQ(spec.agents[1].stop, std::vector<std::string>{"\n"});
}

// A pipeline that does not say runs as the server does: exact on an exact
// server, not on a --no-exact one (where exact: true is refused).
TEST(PipelineRequestTest, APipelineIsExactWhenTheServerIsUnlessItSaysOtherwise) {
  EXPECT_FALSE(parse_pipeline_request(kPipeline, PipelineLimits{.exact = false}).exact);
  EXPECT_TRUE(parse_pipeline_request(kPipeline, PipelineLimits{.exact = true}).exact);
  const std::string inexact =
      R"({"exact": false, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})";
  EXPECT_FALSE(parse_pipeline_request(inexact, PipelineLimits{.exact = true}).exact);
}

TEST(PipelineRequestTest, ARequestNamesNoModelAndNoFile) {
  EXPECT_EQ(pipeline_refusal(R"({"model": "/etc/passwd", "document": "x", "agents": []})"),
            "model: a pipeline request runs on the server's model and cannot name one; leave "
            "'model' out");
  EXPECT_EQ(
      pipeline_refusal(
          R"({"document": {"file": "/etc/passwd"}, "agents": [{"name": "a", "prompt": "b"}]})"),
      "document.file: a pipeline request cannot read the server's files; send the "
      "document as document.text");
  EXPECT_EQ(param_of("document.file: a pipeline request cannot"), "document.file");
  EXPECT_EQ(
      pipeline_refusal(
          R"({"n_gpu_layers": 0, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})"),
      "n_gpu_layers: a pipeline request runs on the server's model as it was loaded (serve "
      "--n-gpu-layers); leave 'n_gpu_layers' out");
}

TEST(PipelineRequestTest, EachRefusalIsPrecise) {
  EXPECT_EQ(pipeline_refusal("[1]"), "body: must be a JSON object, a pipeline (got a array)");
  EXPECT_EQ(pipeline_refusal("{\"agents\": "),
            "body: not JSON ([json.exception.parse_error.101] parse error at line 1, column 12: "
            "syntax error while parsing value - unexpected end of input; expected '[', '{', or a "
            "literal)");
  EXPECT_EQ(pipeline_refusal(R"({"document": "x", "agents": [{"name": "a", "prompt": "b"}],
                                 "n_ctxx": 4})"),
            "body: unknown key 'n_ctxx' in the pipeline (allowed: agents, defaults, "
            "document, exact, flash_attn, fork, kv_type, max_live, model, n_batch, n_ctx, "
            "n_gpu_layers, n_ubatch, name, system, threads, threads_batch)");
  EXPECT_EQ(pipeline_refusal(R"({"document": "x", "agents": [{"name": "a", "prompt": "{{c}}"}]})",
                             {}, ErrorCode::kGraph),
            "body: agent 'a': placeholder {{c}} names unknown agent 'c'");
  EXPECT_EQ(pipeline_refusal(
                R"({"exact": true, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})"),
            "exact: this server runs without the batch-invariant kernels exact mode needs (started "
            "with --no-exact, or a llama.cpp without them); send exact: false, or run the "
            "pipeline with `swarmkv run`");
  PipelineLimits small;
  small.max_agents = 1;
  small.max_tokens = 8;
  EXPECT_EQ(pipeline_refusal(kPipeline, small),
            "agents: 2 agents, more than the 1 this server runs in one pipeline");
  small.max_agents = 2;
  EXPECT_EQ(pipeline_refusal(kPipeline, small),
            "agents[0].max_tokens: 9 is more than the 8 this server allows (--max-tokens)");
}

// The server's threads apply to a posted pipeline: none or 0 (all cores)
// means the server's, fewer are taken, more are refused naming the key.
TEST(PipelineRequestTest, ThreadsAreTheServersAndCannotBeRaised) {
  if (hardware_threads() < 2) GTEST_SKIP() << "needs 2 hardware threads to ask for more than 1";
  const PipelineLimits server{.n_threads = 1, .n_threads_batch = 1};
  const PipelineSpec plain = parse_pipeline_request(kPipeline, server);
  EXPECT_EQ(plain.n_threads, 1);
  EXPECT_EQ(plain.n_threads_batch, 1);
  const std::string all_cores =
      R"({"threads": 0, "threads_batch": 0, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})";
  EXPECT_EQ(parse_pipeline_request(all_cores, server).n_threads, 1);
  EXPECT_EQ(parse_pipeline_request(all_cores, server).n_threads_batch, 1);
  const PipelineLimits two{.n_threads = 2, .n_threads_batch = 2};
  const std::string one =
      R"({"threads": 1, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})";
  EXPECT_EQ(parse_pipeline_request(one, two).n_threads, 1);
  EXPECT_EQ(parse_pipeline_request(one, two).n_threads_batch, 2);
  EXPECT_EQ(
      pipeline_refusal(
          R"({"threads": 2, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})", server),
      "threads: 2 threads, more than the 1 this server runs with (serve -t/--threads); "
      "leave 'threads' out to run on the server's");
  EXPECT_EQ(
      pipeline_refusal(
          R"({"threads_batch": 2, "document": "x", "agents": [{"name": "a", "prompt": "b"}]})",
          server),
      "threads_batch: 2 threads, more than the 1 this server runs with (serve -t/--threads); "
      "leave 'threads_batch' out to run on the server's");
  EXPECT_EQ(parse_pipeline_request(one, {}).n_threads, 1) << "no limit: as the body says";
}

// Python's json writes characters outside the BMP as surrogate pairs: the
// body is JSON, and each pair is one character of the prompt and document.
TEST(PipelineRequestTest, SurrogatePairsReachThePipelineAsTheirCharacters) {
  const PipelineSpec spec = parse_pipeline_request(
      R"({"document": {"text": "Doc \ud83d\udcc4"}, "system": "\ud83d\ude80",
          "agents": [{"name": "a\ud83c\udf89", "prompt": "Say \ud83d\ude00"}]})",
      {});
  EXPECT_EQ(spec.document, "Doc \U0001F4C4");
  EXPECT_EQ(spec.system_prompt, "\U0001F680");
  ASSERT_EQ(spec.agents.size(), 1u);
  EXPECT_EQ(spec.agents[0].name, "a\U0001F389");
  EXPECT_EQ(spec.agents[0].prompt, "Say \U0001F600");
}

// The agent count is a limit on the body, checked before any agent is read
// or the graph is built: the last agent names one that does not exist,
// which the graph check would report.
TEST(PipelineRequestTest, TooManyAgentsAreRefusedBeforeTheirGraphIsChecked) {
  nlohmann::json body = {{"document", "x"}, {"agents", nlohmann::json::array()}};
  for (int i = 0; i < 100000; ++i)
    body["agents"].push_back({{"name", fmt::format("a{}", i)}, {"prompt", "q"}});
  body["agents"].back()["depends_on"] = "nobody";
  EXPECT_EQ(pipeline_refusal(body.dump()),
            "agents: 100000 agents, more than the 64 this server runs in one pipeline");
}

// A body with `documents` or a `scope: corpus` agent is a corpus; without
// either, the pipeline it always was.
constexpr const char* kCorpus = R"({"name": "c", "defaults": {"max_tokens": 9},
  "documents": [{"name": "lease.txt", "text": "A lease."}, {"text": "A loan."}],
  "agents": [{"name": "a", "prompt": "Who?"},
             {"name": "r", "scope": "corpus", "prompt": "Compare: {{a[*]}}", "max_tokens": 5}]})";

TEST(PipelineRequestTest, DocumentsOrAReduceAgentMakeACorpus) {
  const PostedRun posted = parse_posted_run(kCorpus, PipelineLimits{.exact = true});
  ASSERT_TRUE(std::holds_alternative<CorpusSpec>(posted));
  const CorpusSpec& corpus = std::get<CorpusSpec>(posted);
  EXPECT_EQ(corpus.pipeline.name, "c");
  EXPECT_TRUE(corpus.pipeline.exact) << "the server's mode";
  ASSERT_EQ(corpus.documents.size(), 2u);
  EXPECT_EQ(corpus.documents[0].name, "lease.txt");
  EXPECT_EQ(corpus.documents[0].text, "A lease.");
  EXPECT_EQ(corpus.documents[1].name, "text-2");
  EXPECT_TRUE(corpus.documents[1].path.empty());
  ASSERT_EQ(corpus.pipeline.agents.size(), 1u);
  ASSERT_EQ(corpus.reduce.size(), 1u);
  EXPECT_EQ(corpus.reduce[0].max_tokens, 5);
  // One document and a reduce agent: a corpus of one.
  const PostedRun one = parse_posted_run(
      R"({"document": {"text": "x"}, "agents": [{"name": "a", "prompt": "b"},
          {"name": "r", "scope": "corpus", "prompt": "{{a[*]}}"}]})",
      {});
  ASSERT_TRUE(std::holds_alternative<CorpusSpec>(one));
  EXPECT_EQ(std::get<CorpusSpec>(one).documents.size(), 1u);
  const PostedRun plain = parse_posted_run(kPipeline, {});
  ASSERT_TRUE(std::holds_alternative<PipelineSpec>(plain));
  EXPECT_EQ(std::get<PipelineSpec>(plain), parse_pipeline_request(kPipeline, {}));
}

std::string corpus_refusal(const std::string& body, const PipelineLimits& limits = {}) {
  try {
    (void)parse_posted_run(body, limits);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << body;
    return e.message();
  }
  ADD_FAILURE() << "accepted: " << body;
  return "";
}

// A corpus reads no file of the server's, has at most max_documents
// (counted before any is read), and its reduce agents are held to the same
// limits as its other agents.
TEST(PipelineRequestTest, ACorpusSendsItsDocumentsAsTextWithinTheLimits) {
  const std::string files =
      "documents[1]: a pipeline request cannot read the server's files (a "
      "file, glob or folder); send each document as {\"name\": ..., "
      "\"text\": ...}";
  for (const char* item : {R"("/etc/passwd")", R"({"file": "/etc/passwd"})",
                           R"({"file": "/etc/passwd", "text": "x"})", R"(["x"])"}) {
    EXPECT_EQ(corpus_refusal(fmt::format(R"({{"documents": [{{"text": "ok"}}, {}],
                                           "agents": [{{"name": "a", "prompt": "b"}}]}})",
                                         item)),
              files)
        << item;
  }
  EXPECT_EQ(param_of(files), "documents[1]");
  PipelineLimits small{.max_documents = 1, .max_tokens = 8};
  EXPECT_EQ(corpus_refusal(R"({"documents": [{"text": "x"}, "/etc/passwd"],
                               "agents": [{"name": "a", "prompt": "b"}]})",
                           small),
            "documents: 2 documents, more than the 1 this server runs in one corpus "
            "(--max-pipeline-documents)");
  small.max_documents = 2;
  EXPECT_EQ(corpus_refusal(kCorpus, small),
            "agents[0].max_tokens: 9 is more than the 8 this server allows (--max-tokens)");
  small.max_tokens = 9;
  EXPECT_NO_THROW((void)parse_posted_run(kCorpus, small));
  small.max_tokens = 4;
  const std::string reduce_only = R"({"documents": [{"text": "x"}],
    "agents": [{"name": "a", "prompt": "b", "max_tokens": 4},
               {"name": "r", "scope": "corpus", "prompt": "{{a[*]}}", "max_tokens": 5}]})";
  EXPECT_EQ(corpus_refusal(reduce_only, small),
            "agents[1].max_tokens: 5 is more than the 4 this server allows (--max-tokens)");
  small.max_agents = 1;
  EXPECT_EQ(corpus_refusal(reduce_only, small),
            "agents: 2 agents, more than the 1 this server runs in one pipeline");
}

// Per-document and reduce agents share the body's list: each is checked
// against the server's max_tokens at its own place in it (one pass, each
// kind in its order), whatever the two kinds' interleaving.
TEST(PipelineRequestTest, EachAgentOfACorpusIsNamedAtItsPlaceInTheBody) {
  const PipelineLimits limits{.max_tokens = 8};
  const auto body = [](int a, int r, int b) {
    return fmt::format(R"({{"documents": [{{"text": "x"}}],
      "agents": [{{"name": "a", "prompt": "q", "max_tokens": {}}},
                 {{"name": "r", "scope": "corpus", "prompt": "{{{{a[*]}}}}", "max_tokens": {}}},
                 {{"name": "b", "prompt": "q", "max_tokens": {}}}]}})",
                       a, r, b);
  };
  EXPECT_NO_THROW((void)parse_posted_run(body(8, 8, 8), limits));
  EXPECT_EQ(corpus_refusal(body(8, 9, 8), limits),
            "agents[1].max_tokens: 9 is more than the 8 this server allows (--max-tokens)");
  EXPECT_EQ(corpus_refusal(body(8, 8, 9), limits),
            "agents[2].max_tokens: 9 is more than the 8 this server allows (--max-tokens)");
  EXPECT_EQ(corpus_refusal(body(9, 8, 8), limits),
            "agents[0].max_tokens: 9 is more than the 8 this server allows (--max-tokens)");
}

// ------------------------------------------------------------------ streamed text

TEST(TextStreamTest, PiecesAddUpToTheAnswerAndNeverTakeAByteBack) {
  TextStream s({"END", "\n\n"});  // holds back 2 bytes: "EN" may become "END"
  EXPECT_EQ(s.next("Hello", false), "Hel");
  EXPECT_EQ(s.next("Hello wor", false), "lo w");
  EXPECT_EQ(s.next("Hello world E", false), "orld");
  // The stop string came: the tracker cut it, the rest goes out at the end.
  EXPECT_EQ(s.next("Hello world ", true), " ");
  EXPECT_EQ(s.next("Hello world ", true), "");
}

TEST(TextStreamTest, ACharacterSplitOverTokensWaitsForItsLastByte) {
  TextStream s;
  const std::string euro = "\xE2\x82\xAC";  // U+20AC in three bytes
  EXPECT_EQ(s.next("a" + euro.substr(0, 2), false), "a");
  EXPECT_EQ(s.next("a" + euro, false), euro);
  EXPECT_EQ(whole_characters("a" + euro.substr(0, 1), 2), 1u);
  EXPECT_EQ(whole_characters("a" + euro, 4), 4u);
}

// ------------------------------------------------------------ a run as viewers see it

PipelineSpec two_agents() {
  PipelineSpec spec;
  spec.name = "pair";
  spec.document = "A document.";
  spec.agents.resize(2);
  spec.agents[0].name = "first";
  spec.agents[0].prompt = "Q?";
  spec.agents[0].needs.tokens = 64;
  spec.agents[1].name = "second";
  spec.agents[1].prompt = "And?";
  spec.agents[1].depends_on = {"first"};
  return spec;
}

using Kind = PipelineEvent::Kind;

PipelineEvent event(Kind kind, nlohmann::json data) {
  return {kind, std::move(data), std::nullopt};
}

// The events' names on the wire (server-sent events, docs/serve.md).
TEST(PipelineEventTest, EachKindHasItsWireName) {
  EXPECT_EQ(to_string(Kind::kPrefill), "prefill");
  EXPECT_EQ(to_string(Kind::kAgentStarted), "agent_started");
  EXPECT_EQ(to_string(Kind::kToken), "token");
  EXPECT_EQ(to_string(Kind::kAgentDone), "agent_done");
  EXPECT_EQ(to_string(Kind::kDocumentDone), "document_done");
  EXPECT_EQ(to_string(Kind::kResult), "result");
  EXPECT_EQ(to_string(Kind::kError), "error");
  EXPECT_TRUE(event(Kind::kResult, {}).last());
  EXPECT_TRUE(event(Kind::kError, {}).last());
  EXPECT_FALSE(event(Kind::kAgentDone, {}).last());
}

TEST(RunViewTest, EventsMoveEachAgentOnAndTheResultEndsIt) {
  RunView v(two_agents(), 300, "m.gguf");
  EXPECT_EQ(v.state(), RunState::kQueued);
  nlohmann::json r = v.result(0);
  EXPECT_EQ(r["live"]["state"], "queued");
  EXPECT_EQ(r["pipeline"], "pair");
  EXPECT_EQ(r["model"], "m.gguf");
  EXPECT_EQ(r["prefix_tokens"], 300);
  EXPECT_EQ(r["agents"][0]["status"], "waiting");
  EXPECT_EQ(r["agents"][0]["needs"]["tokens"], 64);
  EXPECT_EQ(r["agents"][1]["depends_on"], nlohmann::json::array({"first"}));

  v.begin();
  v.apply(event(Kind::kPrefill, {{"done", 128}, {"total", 300}}), 5);
  r = v.result(6);
  EXPECT_EQ(r["live"]["state"], "running");
  EXPECT_EQ(r["live"]["prefill_done"], 128);
  EXPECT_EQ(r["live"]["prefill_total"], 300);
  EXPECT_EQ(r["prefill_done_at_ms"], 5.0);
  EXPECT_EQ(r["total_ms"], 6.0);

  v.apply(event(Kind::kAgentStarted, {{"agent", "first"}}), 10);
  v.apply(event(Kind::kToken, {{"agent", "first"}, {"token", 7}, {"text", "Hel"}}), 20);
  v.apply(event(Kind::kToken, {{"agent", "first"}, {"token", 8}, {"text", "lo"}}), 30);
  v.apply(event(Kind::kToken, {{"agent", "first"}, {"token", nullptr}, {"text", "!"}}), 31);
  r = v.result(40);
  const nlohmann::json& a = r["agents"][0];
  EXPECT_EQ(a["status"], "running");
  EXPECT_EQ(a["answer"], "Hello!");
  EXPECT_EQ(a["started_at_ms"], 10.0);
  EXPECT_EQ(a["first_token_at_ms"], 20.0);
  EXPECT_EQ(a["token_at_ms"], nlohmann::json::array({20.0, 30.0}));
  EXPECT_EQ(a["n_tokens"], 2);
  EXPECT_EQ(a["done_at_ms"], 40.0) << "a running agent's bar reaches now";
  EXPECT_EQ(r["agents"][1]["status"], "waiting");
  EXPECT_EQ(v.agents_done(), 0u);

  AgentResult done;
  done.name = "first";
  done.answer = "Hello!";
  done.tokens = {7, 8};
  done.token_at_ms = {19.5, 29.5};
  done.timings_ms.started_at = 9.5;
  done.timings_ms.done_at = 32;
  v.apply(event(Kind::kAgentDone, agent_json(done)), 33);
  EXPECT_EQ(v.result(34)["agents"][0], agent_json(done));
  EXPECT_EQ(v.agents_done(), 1u);

  PipelineResult final_result;
  final_result.pipeline = "pair";
  final_result.agents = {done, done};
  final_result.agents[1].name = "second";
  const nlohmann::json final_json = result_json(final_result);
  v.apply(event(Kind::kResult, final_json), 50);
  EXPECT_EQ(v.state(), RunState::kOk);
  EXPECT_EQ(v.agents_done(), 2u);
  nlohmann::json ended = v.result(99);
  EXPECT_EQ(ended["live"]["state"], "ok");
  ended.erase("live");
  EXPECT_EQ(ended, final_json) << "after the result, the view is the result";
  v.apply(event(Kind::kToken, {{"agent", "first"}, {"token", 9}, {"text", "late"}}), 60);
  EXPECT_EQ(v.result(61)["agents"][0]["answer"], "Hello!") << "nothing moves after the end";
}

// A posted corpus's view: corpus_json's shape with the documents done so
// far and the state, then the result; the runs list counts every
// document's agents and the reduce agents.
TEST(RunViewTest, ACorpusViewAddsEachDocumentThenIsItsResult) {
  CorpusSpec corpus;
  corpus.pipeline = two_agents();
  corpus.documents.resize(2);
  corpus.documents[0].name = "a.txt";
  corpus.documents[1].name = "b.txt";
  corpus.reduce.emplace_back().name = "r";
  CorpusView v(corpus, "m.gguf");
  EXPECT_EQ(v.agents(), 5u);
  EXPECT_EQ(v.pipeline(), "pair");
  nlohmann::json r = v.result(0);
  EXPECT_EQ(r["kind"], "corpus");
  EXPECT_EQ(r["state"], "queued");
  EXPECT_EQ(r["documents_total"], 2);
  EXPECT_EQ(r["documents"], nlohmann::json::array());

  v.begin();
  AgentResult ok;
  ok.name = "first";
  ok.answer = "Yes.";
  AgentResult failed = ok;
  failed.name = "second";
  failed.status = NodeStatus::kFailed;
  failed.error = ErrorValue{ErrorCode::kAborted, "cancelled"};
  DocumentOutcome a;
  a.name = "a.txt";
  a.source = "text";
  a.result.emplace();
  a.result->agents = {ok, failed};
  nlohmann::json done = document_json(a);
  done["index"] = 0;
  v.apply(event(Kind::kDocumentDone, done), 10);
  r = v.result(12);
  EXPECT_EQ(r["state"], "running");
  EXPECT_EQ(r["total_ms"], 12.0);
  ASSERT_EQ(r["documents"].size(), 1u);
  EXPECT_EQ(r["documents"][0], document_json(a)) << "as corpus_json writes it, no index";
  EXPECT_EQ(r["documents_run"], 1);
  EXPECT_EQ(r["documents_failed"], 1) << "an agent failed";
  EXPECT_EQ(v.agents_done(), 1u);
  EXPECT_NE(corpus_page_html(r, "run 1", 1).find("<meta http-equiv=\"refresh\" content=\"1\">"),
            std::string::npos);

  CorpusResult result;
  result.pipeline = "pair";
  result.documents = {a, a};
  result.reduce.emplace();
  result.reduce->agents = {ok};
  result.reduce->agents[0].name = "r";
  const nlohmann::json final_json = corpus_json(result);
  v.apply(event(Kind::kResult, final_json), 20);
  EXPECT_EQ(v.state(), RunState::kFailed);
  EXPECT_EQ(v.agents_done(), 3u);
  nlohmann::json ended = v.result(30);
  EXPECT_EQ(ended["state"], "failed");
  ended.erase("state");
  EXPECT_EQ(ended, final_json) << "after the result, the view is the result";
  v.apply(event(Kind::kDocumentDone, done), 40);
  EXPECT_EQ(v.result(41)["documents"].size(), 2u) << "nothing moves after the end";
}

TEST(RunViewTest, ARunThatCouldNotStartSaysWhy) {
  RunView v(two_agents(), 300, "m.gguf");
  v.begin();
  const ErrorValue why{ErrorCode::kBudget, "needs 9 GiB"};
  v.apply({Kind::kError, nlohmann::json::object(), why}, 3);
  EXPECT_EQ(v.state(), RunState::kFailed);
  const nlohmann::json r = v.result(4);
  EXPECT_EQ(r["live"]["state"], "failed");
  EXPECT_EQ(r["live"]["error"]["code"], "budget");
  EXPECT_EQ(r["live"]["error"]["message"], "needs 9 GiB");
  EXPECT_FALSE(r.contains("total_ms")) << "an ended run's clock does not run on";
}

// The page of a run going on: its state line, each agent's status in words
// (not colour alone), the bar of a running agent up to now, and a reload.
TEST(RunViewTest, ThePageOfARunGoingOnSaysWhereItIs) {
  RunView v(two_agents(), 300, "m.gguf");
  v.begin();
  v.apply(event(Kind::kPrefill, {{"done", 128}, {"total", 300}}), 5);
  std::string page = run_page_html(v.result(6), "run 1 on this server", 1);
  EXPECT_NE(page.find("running: the document&#39;s prefill, 128 of 300 tokens (this page reloads "
                      "every 1 s until the run ends)"),
            std::string::npos);
  EXPECT_NE(page.find("300 tokens, not ready yet"), std::string::npos);
  EXPECT_NE(page.find("<meta http-equiv=\"refresh\" content=\"1\">"), std::string::npos);
  EXPECT_NE(page.find("0 ok, 0 failed, 0 not run, 0 running, 2 waiting"), std::string::npos);

  v.apply(event(Kind::kPrefill, {{"done", 300}, {"total", 300}}), 8);
  v.apply(event(Kind::kAgentStarted, {{"agent", "first"}}), 10);
  v.apply(event(Kind::kToken, {{"agent", "first"}, {"token", 7}, {"text", "Hel"}}), 20);
  page = run_page_html(v.result(40), "run 1 on this server", 1);
  EXPECT_NE(page.find("running: 0 of 2 agents done"), std::string::npos);
  EXPECT_NE(page.find("300 tokens, ready at 8 ms"), std::string::npos);
  EXPECT_NE(page.find("<g class=\"node running\"><title>first: running</title>"),
            std::string::npos);
  EXPECT_NE(page.find("<g class=\"node waiting\"><title>second: waiting</title>"),
            std::string::npos);
  EXPECT_NE(page.find("<rect class=\"generate\""), std::string::npos)
      << "a running agent's bar is not drawn as failed";
  EXPECT_EQ(page.find("generate failed"), std::string::npos);
  EXPECT_NE(page.find(">Hel</pre>"), std::string::npos) << "its answer so far";
  EXPECT_EQ(run_page_html(v.result(40)).find("http-equiv=\"refresh\""), std::string::npos);
}

TEST(RunListTest, EachRunLinksToItsPageAndTheListReloadsOnlyWhileOneRuns) {
  std::vector<RunSummary> runs = {{.id = "2",
                                   .pipeline = "b<x>",
                                   .state = "running",
                                   .agents = 5,
                                   .agents_done = 2,
                                   .accepted = "2026-12-05 07:00:00",
                                   .elapsed_ms = 1500},
                                  {.id = "1",
                                   .pipeline = "a",
                                   .state = "ok",
                                   .agents = 3,
                                   .agents_done = 3,
                                   .accepted = "2026-12-05 06:59:00",
                                   .elapsed_ms = 900}};
  std::string page = runs_index_html(runs, "m — swarmkv serve", 2);
  EXPECT_NE(page.find("<tr id=\"run-2\"><td><a href=\"runs/2\">2</a></td><td><a "
                      "href=\"runs/2\">b&lt;x&gt;</a></td><td>running</td><td>2 of 5</td>"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("<a href=\"runs/1\">a</a>"), std::string::npos);
  EXPECT_NE(page.find("<meta http-equiv=\"refresh\" content=\"2\">"), std::string::npos);
  runs[0].state = "failed";
  page = runs_index_html(runs, "m", 2);
  EXPECT_EQ(page.find("http-equiv"), std::string::npos) << "nothing runs: no reload";
  EXPECT_NE(runs_index_html({}, "m", 2).find("No pipeline has been posted yet"), std::string::npos);
}

}  // namespace
}  // namespace swarmkv::server
