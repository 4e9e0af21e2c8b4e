// The OpenAI chat-completions shapes `swarmkv serve` speaks: the request
// parsed and checked field by field, the response and stream-chunk objects,
// and the one map from ErrorCode to an HTTP status and OpenAI's error JSON.
// Pure functions, no engine, no sockets (unit-tested alone).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "swarmkv/engine.h"
#include "swarmkv/error.h"
#include "swarmkv/tools.h"

namespace swarmkv::server {

// What one request may ask for (ServerOptions carries them).
struct RequestLimits {
  int32_t max_messages = 256;
  int32_t max_tokens = 4096;  // the most max_tokens a request may ask for
  int32_t max_n = 8;          // completions per request (per prompt on /v1/completions)
  int32_t max_prompts = 32;   // prompts in one /v1/completions request
  int32_t max_stop = 4;       // OpenAI's own limit
};

// Which OpenAI route a request came by: its body, and the answer's shape.
enum class Endpoint {
  kChat,         // /v1/chat/completions: messages in, a message out
  kCompletions,  // /v1/completions (OpenAI's legacy one): a prompt in, its continuation out
};

// A chat completion, or (endpoint kCompletions) a text completion: `prompt`
// instead of messages, continued as it is (no chat template).
struct ChatRequest {
  Endpoint endpoint = Endpoint::kChat;
  // kCompletions: the texts to continue (one or more); prompt p's choice j
  // is the answer's choice p * n + j.
  std::vector<std::string> prompts;
  // kCompletions given as token ids instead (one list per prompt): decoded
  // as they are; the server fills `prompts` with their text.
  std::vector<std::vector<Token>> prompt_tokens;
  std::string model;  // "" when not given; the server answers 404 model_not_found to a name it does
                      // not list
  std::vector<ChatMessage> messages;
  int32_t max_tokens = 0;  // 0: not given (the server's default applies)
  SamplingOptions sampling;
  bool seed_given = false;  // "seed" was in the body; else the server draws one per request
  std::vector<std::string> stop;
  int32_t n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // The functions the answer is a call of (tool_choice "required" or a named
  // one, or "auto": see tool_or_text); empty: the answer is text. The grammar
  // and the system prompt say so.
  std::vector<ToolFunction> tools;
  // tool_choice "auto": the answer is a call of one of `tools` or text, as
  // {"response": ...} (tool_call_schema's `or_text`).
  bool tool_or_text = false;
  // kCompletions "echo": each choice's text (and logprobs) starts with its
  // prompt's.
  bool echo = false;
  // kCompletions "max_tokens": 0 with echo: nothing is generated (the
  // prompt alone, scored with logprobs); max_tokens stays 0.
  bool prompt_only = false;
  // With echo and logprobs, per prompt as tokenised (the server fills it):
  // the tokens the tokenizer put before the text (BOS), which are not
  // listed, and the first listed token's text when nothing came before it
  // (its logprob is then null, as OpenAI's first token's).
  struct EchoedPrompt {
    size_t added = 0;
    std::string first_text;
  };
  std::vector<EchoedPrompt> echoed;

  // The answer's choices: n, or n for each prompt.
  int32_t choices() const {
    const size_t p = std::max(prompts.size(), prompt_tokens.size());
    return p == 0 ? n : n * static_cast<int32_t>(p);
  }
};

// Throws Error(kInvalidArgument) "<field>: <what>", the shape of every
// request refusal (param_of() recovers the field).
[[noreturn]] void refuse(std::string_view field, std::string_view what);
// A request body as JSON; throws "body: not JSON (...)" (refuse).
nlohmann::json parse_body(std::string_view body);

// Parses and checks a /v1/chat/completions body. Throws
// Error(kInvalidArgument) whose message starts with the offending field's
// path, e.g. "messages[1].role: must be system, user or assistant (got
// \"tool\")" or "body: not JSON (...)"; param_of() recovers the path.
ChatRequest parse_chat_request(std::string_view body, const RequestLimits& limits);
// Parses and checks a /v1/completions body the same way: "prompt" (a string,
// an array of up to max_prompts strings, an array of token ids or an array
// of up to max_prompts arrays of them), max_tokens (default 16, as OpenAI's), the sampling
// fields, "logprobs" (an integer, 0 to 5), "stream", "echo"; "suffix" and a
// "best_of" other than n are refused by name.
ChatRequest parse_completion_request(std::string_view body, const RequestLimits& limits);

// OpenAI's choice "logprobs": {"content": [{"token", "logprob", "bytes",
// "top_logprobs": [...]}], "refusal": null}.
nlohmann::json logprobs_json(std::span<const SampledLogprobs> tokens);

// The completions endpoint's "logprobs": {"tokens", "token_logprobs",
// "top_logprobs" (a {piece: logprob} object per token, null without `top`),
// "text_offset"}, each token's offset counted from the prompt's start
// (`prompt_chars` before the first), as OpenAI's are. With `prompt` (echo)
// the prompt's tokens come first, from offset 0: `unscored` (the text of a
// first token with nothing before it: logprob and top_logprobs null), then
// `scored`.
struct PromptLogprobs {
  std::optional<std::string> unscored;
  std::span<const SampledLogprobs> scored;
};
nlohmann::json completion_logprobs_json(std::span<const SampledLogprobs> tokens,
                                        size_t prompt_chars, bool top,
                                        const PromptLogprobs* prompt = nullptr);

// The field path an error message of parse_chat_request starts with ("" if
// none): OpenAI's error "param".
std::string param_of(const std::string& message);

// An error as HTTP: the status, OpenAI's error "type" and "code".
struct HttpError {
  int status = 500;
  std::string_view type = "server_error";  // "invalid_request_error", ...
  std::string_view code;  // OpenAI's own code ("invalid_api_key", ...); empty: the ErrorCode's name
};
// The one ErrorCode -> HTTP map: bad input 400, not found 404, budget 400
// (OpenAI's context_length_exceeded), no KV slot and shutdown 503, other
// engine failures 500.
HttpError http_error(ErrorCode code) noexcept;
// {"error": {"message", "type", "param", "code"}}: "param" the field the
// message starts with (param_of) or null.
nlohmann::json error_body(const ErrorValue& error, const HttpError& as);

// OpenAI's finish_reason for a stop reason: "stop" or "length".
std::string_view finish_reason(StopReason reason) noexcept;

}  // namespace swarmkv::server
