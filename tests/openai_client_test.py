#!/usr/bin/env python3
"""`swarmkv serve` from OpenAI's own Python client (scripts/browser-requirements.txt
pins it), as an agent framework calls it.

    openai_client_test.py SWARMKV MODEL

Checks, against one server (exact mode, its default):
  - chat.completions.parse with a Pydantic model: the answer parses into it,
    every field within its constraints (response_format json_schema, strict);
  - tools with tool_choice "required", "auto" and a named function: the answer is a
    call (or, under "auto", maybe text), message.tool_calls in OpenAI's shape, its arguments valid for the
    function's schema; streamed, the same call;
  - a sampled request without seed returns the seed it drew
    (X-SwarmKV-Seed); sent back as seed, the same answer;
  - logprobs with top_logprobs: one entry per answer token, read by the
    client's types;
  - min_p is applied; a field the server does not take is a
    BadRequestError naming it;
  - completions.create (the legacy endpoint): the prompt continued, its
    logprobs (tokens, text_offset from the prompt's start, top_logprobs),
    streamed the same; two prompts in one request, from the client and
    from LangChain's OpenAI LLM; echo with the prompt's logprobs;
  - LangChain's ChatOpenAI: with_structured_output by json_schema and by
    function_calling parses into the Pydantic model, by json_mode gives a
    JSON object; bind_tools with its default tool_choice ("auto"), "required" and a named tool
    gives tool_calls with arguments valid for the tool.
"""

import json
import sys
import tempfile
from typing import Literal

import openai
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI, OpenAI
from pydantic import BaseModel, Field

from serve_process import served


def expect(condition, message):
    if not condition:
        raise AssertionError(message)


class Risk(BaseModel):
    risk_level: Literal["low", "medium", "high"]
    reason: str = Field(max_length=60)
    clauses: list[int] = Field(max_length=3)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20},
                           "unit": {"type": "string", "enum": ["C", "F"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}},
                       "required": ["zone"], "additionalProperties": False},
    },
}


def structured_output(client):
    completion = client.chat.completions.parse(
        model="swarmkv", max_tokens=96, temperature=0,
        messages=[{"role": "user", "content":
                   "Clause 4 lets the vendor raise prices at will. Rate the risk."}],
        response_format=Risk)
    choice = completion.choices[0]
    expect(choice.finish_reason == "stop", f"finish_reason {choice.finish_reason}: {choice}")
    parsed = choice.message.parsed
    expect(isinstance(parsed, Risk), f"not parsed into Risk: {choice.message}")
    expect(len(parsed.reason) <= 60 and len(parsed.clauses) <= 3, f"constraints: {parsed}")
    print(f"parse: {parsed!r}")


def tool_calls(client):
    ask = [{"role": "user", "content": "What is the weather in Oslo? Use a tool."}]
    named = client.chat.completions.create(
        model="swarmkv", max_tokens=64, temperature=0, messages=ask, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = named.choices[0]
    expect(choice.finish_reason == "tool_calls", f"finish_reason: {choice}")
    call = choice.message.tool_calls[0]
    expect(call.type == "function" and call.function.name == "get_weather", f"call: {call}")
    args = json.loads(call.function.arguments)
    expect(set(args) == {"city", "unit"} and args["unit"] in ("C", "F")
           and len(args["city"]) <= 20, f"arguments: {args}")

    required = client.chat.completions.create(
        model="swarmkv", max_tokens=64, temperature=0, messages=ask, tools=[WEATHER, TIME],
        tool_choice="required")
    name = required.choices[0].message.tool_calls[0].function.name
    expect(name in ("get_weather", "get_time"), f"required: {name}")

    stream = client.chat.completions.create(
        model="swarmkv", max_tokens=64, temperature=0, messages=ask, tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
    streamed, finish = [], None
    for chunk in stream:
        for c in chunk.choices:
            streamed.extend(c.delta.tool_calls or [])
            finish = c.finish_reason or finish
    expect(finish == "tool_calls" and len(streamed) == 1, f"streamed: {streamed} {finish}")
    expect(streamed[0].function.name == call.function.name
           and streamed[0].function.arguments == call.function.arguments,
           f"streamed {streamed[0]} vs {call}")

    # The next turn reads the call and its result.
    reply = client.chat.completions.create(
        model="swarmkv", max_tokens=24, temperature=0, tools=[WEATHER], tool_choice="none",
        messages=ask + [choice.message.model_dump(exclude_none=True),
                        {"role": "tool", "tool_call_id": call.id, "content": "-3 C, snow"}])
    expect(isinstance(reply.choices[0].message.content, str), f"reply: {reply}")

    # "auto" (the default with tools): a call or text, the model's choice.
    auto = client.chat.completions.create(model="swarmkv", max_tokens=64, temperature=0,
                                          messages=ask, tools=[WEATHER]).choices[0]
    expect((auto.finish_reason == "tool_calls" and auto.message.tool_calls[0].function.name
            == "get_weather") or (auto.finish_reason == "stop" and not auto.message.tool_calls
                                  and isinstance(auto.message.content, str)), f"auto: {auto}")
    print(f"tools: {call.function.name}({call.function.arguments}), required chose {name}, "
          f"auto {auto.finish_reason}")


def seeds_and_fields(client):
    ask = [{"role": "user", "content": "Invent a name for a new colour."}]
    raw = client.chat.completions.with_raw_response.create(
        model="swarmkv", max_tokens=12, temperature=1.5, messages=ask)
    seed = raw.headers.get("X-SwarmKV-Seed")
    expect(seed is not None, f"no X-SwarmKV-Seed in {dict(raw.headers)}")
    first = raw.parse().choices[0].message.content
    again = client.chat.completions.create(model="swarmkv", max_tokens=12, temperature=1.5,
                                           messages=ask, seed=int(seed))
    expect(again.choices[0].message.content == first,
           f"seed {seed}: {again.choices[0].message.content!r} vs {first!r}")

    greedy = client.chat.completions.create(model="swarmkv", max_tokens=8, temperature=0,
                                            messages=ask).choices[0].message.content
    hot_min_p = client.chat.completions.create(model="swarmkv", max_tokens=8, temperature=1.5,
                                               messages=ask, extra_body={"min_p": 1.0})
    expect(hot_min_p.choices[0].message.content == greedy, "min_p 1 did not keep greedy's token")
    scored = client.chat.completions.create(model="swarmkv", max_tokens=8, temperature=0,
                                            messages=ask, logprobs=True, top_logprobs=2)
    tokens = scored.choices[0].logprobs.content
    expect(len(tokens) == scored.usage.completion_tokens
           and "".join(t.token for t in tokens) == greedy
           and all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens),
           f"logprobs: {scored.choices[0].logprobs}")
    try:
        client.chat.completions.create(model="swarmkv", max_tokens=8, messages=ask,
                                       extra_body={"mirostat": 2})
        raise AssertionError("an unknown field was accepted")
    except openai.BadRequestError as e:
        expect(e.body.get("param") == "mirostat", f"unknown field: {e.body}")
    print(f"seed {seed} repeats {first!r}")


def text_completions(client):
    """OpenAI's legacy completions endpoint: the prompt continued as written,
    streamed the same, its logprobs in that endpoint's shape."""
    prompt = "The capital of France is"
    whole = client.completions.create(model="swarmkv", prompt=prompt, max_tokens=6,
                                      temperature=0, logprobs=2)
    choice = whole.choices[0]
    expect(whole.object == "text_completion" and choice.text, f"completion: {whole}")
    expect("".join(choice.logprobs.tokens) == choice.text
           and choice.logprobs.text_offset[0] == len(prompt)
           and all(len(top) <= 2 for top in choice.logprobs.top_logprobs),
           f"completion logprobs: {choice.logprobs}")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="swarmkv", prompt=prompt, max_tokens=6, temperature=0, stream=True) if c.choices)
    expect(streamed == choice.text, f"streamed {streamed!r} vs {choice.text!r}")
    # echo: the prompt repeated, its tokens scored first (the first one,
    # with nothing before it, None), as lm-eval-style scorers read them.
    echoed = client.completions.create(model="swarmkv", prompt=prompt, max_tokens=6,
                                       temperature=0, logprobs=1, echo=True).choices[0]
    lp = echoed.logprobs
    expect(echoed.text == prompt + choice.text and "".join(lp.tokens) == echoed.text
           and lp.text_offset[0] == 0 and lp.token_logprobs[0] is None
           and all(v <= 0 for v in lp.token_logprobs[1:])
           and lp.token_logprobs[-len(choice.logprobs.tokens):] == choice.logprobs.token_logprobs,
           f"echo: {echoed}")
    # Several prompts in one request, as LangChain's OpenAI LLM batches them:
    # one choice per prompt, in order, each its prompt's own answer.
    other = "Water boils at a temperature of"
    alone = client.completions.create(model="swarmkv", prompt=other, max_tokens=6, temperature=0)
    both = client.completions.create(model="swarmkv", prompt=[prompt, other], max_tokens=6,
                                     temperature=0)
    expect([c.index for c in both.choices] == [0, 1]
           and [c.text for c in both.choices] == [choice.text, alone.choices[0].text],
           f"two prompts: {both}")
    llm = OpenAI(base_url=str(client.base_url), api_key="k", model="swarmkv", max_tokens=6,
                 temperature=0)
    batched = llm.generate([prompt, other])
    expect([g[0].text for g in batched.generations] == [choice.text, alone.choices[0].text],
           f"LangChain OpenAI batch: {batched}")
    print(f"completion {prompt!r} -> {choice.text!r}; with {other!r} in one request too")


@tool
def get_weather(city: str, unit: Literal["C", "F"]) -> str:
    """The weather now in a city."""
    return f"-3 {unit} in {city}"


@tool
def get_time(zone: str) -> str:
    """The time now in a time zone."""
    return f"12:00 in {zone}"


def langchain_calls(port):
    llm = ChatOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", model="swarmkv",
                     temperature=0, max_tokens=96, max_retries=0, timeout=300)
    ask = "Clause 4 lets the vendor raise prices at will. Rate the risk."
    for method in ("json_schema", "function_calling"):
        out = llm.with_structured_output(Risk, method=method, include_raw=True).invoke(ask)
        expect(out["parsing_error"] is None and isinstance(out["parsed"], Risk),
               f"with_structured_output {method}: {out}")
        if method == "function_calling":
            expect(out["raw"].tool_calls[0]["name"] == "Risk", f"{method}: {out['raw']}")
        print(f"langchain {method}: {out['parsed']!r}")
    # json_mode promises a JSON object, not the schema (as OpenAI's).
    raw = llm.with_structured_output(Risk, method="json_mode", include_raw=True).invoke(ask)["raw"]
    expect(isinstance(json.loads(raw.content), dict), f"json_mode: {raw.content!r}")

    where = "What is the weather in Oslo?"
    # bind_tools' default tool_choice is OpenAI's "auto".
    message = llm.bind_tools([get_weather, get_time]).invoke(where)
    expect(message.tool_calls or isinstance(message.content, str), f"bind_tools auto: {message}")
    print(f"langchain bind_tools auto: {message.tool_calls or message.content!r}")
    for choice, names in (("required", {"get_weather", "get_time"}), ("get_time", {"get_time"})):
        message = llm.bind_tools([get_weather, get_time], tool_choice=choice).invoke(where)
        expect(len(message.tool_calls) == 1, f"bind_tools {choice}: {message}")
        call = message.tool_calls[0]
        expect(call["name"] in names, f"bind_tools {choice}: {call}")
        chosen = get_weather if call["name"] == "get_weather" else get_time
        chosen.args_schema.model_validate(call["args"])  # raises unless valid for the tool
        print(f"langchain bind_tools {choice}: {call['name']}({call['args']}) -> "
              f"{chosen.invoke(call['args'])!r}")


def main():
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} SWARMKV MODEL")
    swarmkv, model = sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="swarmkv-openai-") as tmp, \
            served(swarmkv, model, tmp, ("--api-key", "k", "--snapshot-cache", "off")) as (_, port, _):
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k",
                               max_retries=0, timeout=300)
        structured_output(client)
        tool_calls(client)
        seeds_and_fields(client)
        text_completions(client)
        langchain_calls(port)


if __name__ == "__main__":
    main()
