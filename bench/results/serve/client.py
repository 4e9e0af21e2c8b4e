#!/usr/bin/env python3
"""Fires N concurrent streamed chat requests at an OpenAI-compatible server
and records, per request, the time to first token and to the end; one JSON
object on stdout. Standard library only: the same client for every server."""
import argparse, http.client, json, threading, time

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--agents", type=int, default=16)
p.add_argument("--doc-sentences", type=int, default=350)
p.add_argument("--max-tokens", type=int, default=32)
a = p.parse_args()

# The seed's synthetic document (include/swarmkv/synthetic.h), ~10 tokens a sentence.
doc = "The quick brown fox jumps over the lazy dog. " * a.doc_sentences
results = [None] * a.agents
start = threading.Barrier(a.agents + 1)

def agent(i):
    body = json.dumps({"model": "swarmkv", "temperature": 0, "max_tokens": a.max_tokens,
                       "stream": True, "stream_options": {"include_usage": True},
                       "messages": [{"role": "user", "content":
                                     f"{doc}\n\nAgent {i}: summarise the text above in one line."}]})
    conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=3600)
    start.wait()
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    ttft, text, usage, buf = None, "", None, b""
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            piece = (c.get("delta") or {}).get("content")
            if piece:
                if ttft is None:
                    ttft = time.monotonic() - t0
                text += piece
    results[i] = {"agent": i, "status": resp.status, "ttft_s": ttft,
                  "end_s": time.monotonic() - t0, "t0": t0, "text": text, "usage": usage}

threads = [threading.Thread(target=agent, args=(i,)) for i in range(a.agents)]
for t in threads:
    t.start()
start.wait()
t_start = time.monotonic()
for t in threads:
    t.join()
end_to_end = max(r["t0"] + r["end_s"] for r in results) - t_start
print(json.dumps({"agents": a.agents, "max_tokens": a.max_tokens, "end_to_end_s": end_to_end,
                  "requests": results}))
