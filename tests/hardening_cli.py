#!/usr/bin/env python3
"""The command line under hostile input: one CTest case per hardening item.

    hardening_cli.py CASE SWARMKV_BINARY SOURCE_DIR [MODEL]

Each case runs the real binary in a fresh temporary directory and checks the
exit status and the exact words a user reads. Cases that need MODEL are
registered only when the build has a test model. Every child runs with a
time limit; the memory cases also under an address-space limit, so that a
regression fails the test instead of the machine.
"""
import concurrent.futures
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


class Ctx:
    def __init__(self, cli, source, model, tmp):
        self.cli, self.source, self.model, self.tmp = cli, source, model, tmp

    def path(self, name):
        return os.path.join(self.tmp, name)

    def write(self, name, data):
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(self.path(name), mode) as f:
            f.write(data)
        return self.path(name)

    def run(self, *args, env=None, timeout=120, stdout=None, address_space=None):
        full_env = dict(os.environ)
        full_env.pop("SWARMKV_LOG_LEVEL", None)
        full_env["SWARMKV_CACHE"] = self.path("cache")
        full_env.update(env or {})

        def limit():
            if address_space:
                resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

        p = subprocess.run([self.cli, *args], env=full_env, timeout=timeout,
                           stdout=stdout if stdout is not None else subprocess.PIPE,
                           stderr=subprocess.PIPE, preexec_fn=limit, cwd=self.tmp)
        out = p.stdout.decode("utf-8", "replace") if p.stdout is not None else ""
        return p.returncode, out, p.stderr.decode("utf-8", "replace")


def expect(rc, err, want_rc, want_text):
    assert rc == want_rc, f"exit {rc}, want {want_rc}; stderr: {err}"
    assert want_text in err, f"stderr lacks {want_text!r}: {err}"


GOOD_AGENTS = "agents:\n  - {name: a, prompt: q}\n"

# ------------------------------------------------------------------ loses results


@case
def json_survives_an_answer_cut_inside_a_character(ctx):
    rc, out, err = ctx.run("generate", "--model", ctx.model, "--raw", "-p", "🚀🚀🚀🚀🚀🚀🚀🚀",
                           "-n", "1", "--json")
    assert rc == 0, err
    j = json.loads(out)
    assert j["n_tokens"] == 1 and j["answer"], j


@case
def invalid_utf8_agent_name_is_refused_by_name(ctx):
    p = ctx.write("p.yaml", b"document: {text: x}\nagents:\n  - {name: \"a\xff\", prompt: q}\n")
    rc, out, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--json")
    expect(rc, err, 2, "the name of agents[0] is not valid UTF-8 text on one line")
    assert json.loads(out)["error"]["code"] == "invalid_argument", out


def on_a_terminal(ctx, *args):
    """Runs the binary with stdout and stderr on a pseudo-terminal: (exit status, what it showed)."""
    import pty
    main, sub = pty.openpty()
    env = dict(os.environ, SWARMKV_CACHE=ctx.path("cache"))
    env.pop("SWARMKV_LOG_LEVEL", None)
    p = subprocess.Popen([ctx.cli, *args], stdout=sub, stderr=sub, stdin=subprocess.DEVNULL, env=env,
                         cwd=ctx.tmp)
    os.close(sub)
    shown = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        shown += chunk
    os.close(main)
    return p.wait(timeout=120), shown.decode("utf-8", "replace")


@case
def control_characters_reach_a_terminal_escaped(ctx):
    # A title-setting OSC and a screen clear in an agent's name, quoted back by
    # the error that names it (before any model loads).
    agent = "  - {name: \"a\\e]0;pwned\\a\\e[2J\", prompt: q}\n"
    p = ctx.write("p.yaml", "document: {text: x}\nagents:\n" + agent + agent)
    rc, shown = on_a_terminal(ctx, "run", p, "--model", "/nonexistent.gguf")
    assert rc == 2, (rc, shown)
    assert "\x1b" not in shown and "\x07" not in shown, repr(shown)
    assert "a\\x1b]0;pwned\\x07\\x1b[2J" in shown, repr(shown)
    # Output to a pipe is kept as it is: programs read it.
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf")
    assert rc == 2 and "a\x1b]0;pwned\x07\x1b[2J" in err, repr(err)


@case
def run_to_a_full_stdout_fails(ctx):
    p = ctx.write("p.yaml", "document: {text: The sky is blue.}\n"
                 "agents:\n  - {name: a, prompt: \"What colour is the sky?\", max_tokens: 2}\n")
    with open("/dev/full", "wb") as full:
        rc, _, err = ctx.run("run", p, "--model", ctx.model, "--snapshot-cache", "off",
                             stdout=full)
    expect(rc, err, 1, "io: writing to stdout failed; the output is lost")


@case
def listing_to_a_full_stdout_fails(ctx):
    with open("/dev/full", "wb") as full:
        rc, _, err = ctx.run("snapshot", "--cache-dir", ctx.path("store"), "ls", stdout=full)
    expect(rc, err, 1, "io: writing to stdout failed")


@case
def bench_unwritable_results_fail(ctx):
    os.makedirs(ctx.path("out/best_run.json"))
    rc, _, err = ctx.run("bench", "--model", ctx.model, "--doc-tokens", "16", "--branches", "1",
                         "--branch-tokens", "4", "--n-predict", "1", "--trials", "1", "--arms",
                         "none", "--out", ctx.path("out"))
    expect(rc, err, 1, f"io: cannot write '{ctx.path('out/best_run.json')}'")
    assert "results in" not in err, err

# ------------------------------------------------------------------ can take the machine down


@case
def huge_document_is_refused_before_allocating(ctx):
    doc = ctx.write("big.txt", "The parties agree to the terms below. " * 140000)  # 5.3 MB
    p = ctx.write("p.yaml", "document: {file: big.txt}\n" + GOOD_AGENTS)
    start = time.monotonic()
    rc, _, err = ctx.run("run", p, "--model", ctx.model, "--snapshot-cache", "off",
                         address_space=8 << 30, timeout=300)
    expect(rc, err, 2, "needs")
    assert re.search(r"prefix_tokens \d{6,} \+ prompt_tokens \d+ \+ max_tokens 128 > "
                     r"n_ctx_train 8192, the context the model was trained on", err), err
    assert os.path.getsize(doc) > 5_000_000
    print(f"refused in {time.monotonic() - start:.1f} s")


@case
def threads_out_of_range_on_the_command_line(ctx):
    p = ctx.write("p.yaml", "document: {text: x}\n" + GOOD_AGENTS)
    for value in ("1000", "-1"):
        rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--threads", value)
        expect(rc, err, 2, "threads must be 0 (all cores) or 1..")
        assert f"(got {value})" in err, err
    rc, _, err = ctx.run("generate", "--model", "/nonexistent.gguf", "-p", "hi", "--threads",
                         "1000")
    expect(rc, err, 2, "(got 1000)")


@case
def threads_and_n_batch_in_the_file(ctx):
    p = ctx.write("t.yaml", "threads: -3\ndocument: {text: x}\n" + GOOD_AGENTS)
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf")
    expect(rc, err, 2, "pipeline.threads must be in 0..")
    assert "got -3 (line 1)" in err, err
    p = ctx.write("b.yaml", "n_batch: 0\ndocument: {text: x}\n" + GOOD_AGENTS)
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--fork", "shared")
    expect(rc, err, 2, "pipeline.n_batch must be in 1..65536, got 0 (line 1)")


@case
def many_agents_are_refused_by_memory(ctx):
    agents = "".join(f"  - {{name: a{i}, prompt: \"Question {i}?\"}}\n" for i in range(700))
    p = ctx.write("p.yaml", "document: {file: %s/examples/documents/apache-2.0.txt}\n"
                 "agents:\n%s" % (ctx.source, agents))
    rc, _, err = ctx.run("run", p, "--model", ctx.model, "--snapshot-cache", "off",
                         address_space=1200 << 20, timeout=120)
    expect(rc, err, 2, "budget: not enough memory: fork shared needs about")
    assert "the address-space limit (ulimit -v)" in err, err
    assert "GGML_ASSERT" not in err, err

# ------------------------------------------------------------------ accepts nonsense silently


@case
def empty_yaml_values_are_errors(ctx):
    for body, want in (
        ("document: {text: x}\nagents:\n  - {name: a, prompt: }\n",
         "agents[0].prompt has no value (line 3)"),
        ("document: {text: x}\nagents:\n  - {name: , prompt: q}\n",
         "agents[0].name has no value (line 3)"),
        ("document: {text: }\n" + GOOD_AGENTS, "document.text has no value (line 1)"),
    ):
        rc, _, err = ctx.run("run", ctx.write("p.yaml", body), "--check")
        expect(rc, err, 2, want)


@case
def non_finite_temperature_is_refused(ctx):
    for value in (".nan", ".inf", "-.inf"):
        p = ctx.write("p.yaml", "document: {text: x}\nagents:\n"
                     f"  - {{name: a, prompt: q, temperature: {value}}}\n")
        rc, _, err = ctx.run("run", p, "--check")
        expect(rc, err, 2, "need a finite temperature")
    rc, _, err = ctx.run("generate", "--model", "/nonexistent.gguf", "-p", "hi", "--temp", "nan")
    expect(rc, err, 2, "need a finite temperature (got nan)")
    rc, _, err = ctx.run("generate", "--model", "/nonexistent.gguf", "-p", "hi", "--temp", "inf")
    expect(rc, err, 2, "--temp: Value inf not in range")


@case
def duplicate_yaml_keys_are_errors(ctx):
    p = ctx.write("p.yaml", "document: {text: x}\nagents:\n"
                 "  - name: a\n    prompt: first\n    prompt: second\n")
    rc, _, err = ctx.run("run", p, "--check")
    expect(rc, err, 2, "key 'prompt' is given twice in agents[0] (lines 4 and 5)")


@case
def empty_stop_string_is_refused(ctx):
    p = ctx.write("p.yaml", "document: {text: x}\nagents:\n"
                 "  - {name: a, prompt: q, stop: [\"\"]}\n")
    rc, _, err = ctx.run("run", p, "--check")
    expect(rc, err, 2, "agents[0].stop holds an empty string")
    rc, _, err = ctx.run("generate", "--model", "/nonexistent.gguf", "-p", "hi", "--stop", "")
    expect(rc, err, 2, "--stop is empty")


@case
def bad_log_level_in_the_environment_is_refused(ctx):
    rc, _, err = ctx.run("snapshot", "--cache-dir", ctx.path("s"), "ls",
                         env={"SWARMKV_LOG_LEVEL": "loud"})
    expect(rc, err, 2, "$SWARMKV_LOG_LEVEL: unknown log level 'loud'")


@case
def readme_pipeline_example_parses(ctx):
    with open(os.path.join(ctx.source, "README.md")) as f:
        readme = f.read()
    section = readme[readme.index("## Pipeline files"):]
    block = section[section.index("```yaml\n") + 8:section.index("```", section.index("```yaml\n") + 8)]
    ctx.write("contract.txt", "The contract.")
    rc, out, err = ctx.run("run", ctx.write("readme.yaml", block), "--check")
    assert rc == 0, f"the README's example does not load: {err}"
    assert "is valid: 3 agents" in out, out

# ------------------------------------------------------------------ a document is data


@case
def nul_bytes_in_document_and_prompt_file(ctx):
    ctx.write("doc.txt", b"clause one\x00clause two")
    p = ctx.write("p.yaml", "document: {file: doc.txt}\n" + GOOD_AGENTS)
    rc, _, err = ctx.run("run", p, "--check")
    expect(rc, err, 2, f"the document (file:{ctx.path('doc.txt')}) contains a NUL byte at offset 10")
    prompt = ctx.write("prompt.txt", b"hello\x00world")
    rc, _, err = ctx.run("generate", "--model", "/nonexistent.gguf", "--prompt-file", prompt)
    expect(rc, err, 2, f"--prompt-file '{prompt}' contains a NUL byte at offset 5")

# ------------------------------------------------------------------ messages that mislead


@case
def directories_are_not_files(ctx):
    os.makedirs(ctx.path("d"))
    rc, _, err = ctx.run("generate", "--model", ctx.path("d"), "-p", "hi")
    expect(rc, err, 2, f"model file (from --model) '{ctx.path('d')}' is a directory, not a file")
    rc, _, err = ctx.run("run", ctx.path("d"))
    expect(rc, err, 2, f"pipeline file '{ctx.path('d')}' is a directory, not a file")
    p = ctx.write("p.yaml", "document: {file: d}\n" + GOOD_AGENTS)
    rc, _, err = ctx.run("run", p, "--check")
    expect(rc, err, 2, f"document file '{ctx.path('d')}' is a directory, not a file")


@case
def snapshot_store_that_is_a_file_is_named(ctx):
    f = ctx.write("store", "not a directory")
    for command in ("ls", "gc"):
        rc, _, err = ctx.run("snapshot", "--cache-dir", f, command)
        expect(rc, err, 2, f"snapshot store '{f}' is not a directory")


@case
def document_file_must_be_a_path(ctx):
    p = ctx.write("p.yaml", "document: {file: {x: 1}}\n" + GOOD_AGENTS)
    rc, _, err = ctx.run("run", p, "--check")
    expect(rc, err, 2, f"{p}: document.file must be a single value, not a mapping (line 1)")


@case
def range_errors_name_file_and_line(ctx):
    p = ctx.write("p.yaml", "document: {text: x}\nagents:\n"
                 "  - {name: a, prompt: q, max_tokens: -1}\n")
    rc, _, err = ctx.run("run", p, "--check")
    expect(rc, err, 2, f"{p}: agents[0].max_tokens must be in 1..2147483647, got -1 (line 3)")


@case
def model_load_error_gives_llama_reason_once(ctx):
    not_gguf = ctx.write("notes.gguf", "# just text\n" * 10)
    rc, _, err = ctx.run("generate", "--model", not_gguf, "-p", "hi")
    expect(rc, err, 2, "llama.cpp says: gguf_init_from_reader: invalid magic characters")
    assert err.count("invalid magic characters") == 1, err
    assert "SWARMKV_LOG_LEVEL=debug" not in err, err


@case
def gpu_layers_on_a_cpu_build_warn_and_are_reported(ctx):
    p = ctx.write("g.yaml", "document: {text: Clause 1. The lessee pays rent.}\n"
                  "agents:\n  - {name: a, prompt: \"Who pays?\", max_tokens: 2}\n")
    rc, out, err = ctx.run("run", p, "--model", ctx.model, "--snapshot-cache", "off", "--json",
                           "--n-gpu-layers", "99")
    assert rc == 0, (rc, err)
    assert "n_gpu_layers 99: this llama.cpp has no GPU backend compiled in" in err, err
    r = json.loads(out)
    assert r["engine"]["n_gpu_layers"] == 99 and r["engine"]["offloaded_layers"] == 0, r["engine"]
    assert r["exact"] is True and r["exact_unavailable"] is None, r
    rc, _, err = ctx.run("run", p, "--model", ctx.model, "--ngl", "-2")
    expect(rc, err, 2, "--n-gpu-layers: Value -2 not in range")


@case
def unknown_subcommand_is_named(ctx):
    rc, _, err = ctx.run("frobnicate")
    expect(rc, err, 2, "unknown command 'frobnicate' (commands: generate, run, bench")


@case
def version_names_the_build(ctx):
    rc, out, err = ctx.run("--version")
    assert rc == 0, (rc, err)
    lines = out.strip().split("\n")
    assert re.fullmatch(r"swarmkv \d+\.\d+\.\d+", lines[0]), out
    assert re.fullmatch(r"llama\.cpp [0-9a-f]{7,40} \(our patches [0-9a-f]+\)", lines[1]), out
    assert re.fullmatch(r"backends: (\w+)(, \w+)*", lines[2]) and "CPU" in lines[2], out


@case
def exit_codes_follow_the_convention(ctx):
    rc, out, _ = ctx.run("--help")
    assert rc == 0 and "Exit status: 0 success; 1 the run failed" in out and "130 interrupted" in out, out
    rc, _, err = ctx.run("run")  # a required argument missing
    expect(rc, err, 2, "pipeline is required")
    rc, _, err = ctx.run("generate", "--bogus")
    expect(rc, err, 2, "--bogus")
    rc, _, err = ctx.run("run", ctx.path("missing.yaml"))
    expect(rc, err, 2, "does not exist")


@case
def json_error_on_early_failure(ctx):
    rc, out, err = ctx.run("run", "--json", ctx.path("missing.yaml"))
    expect(rc, err, 2, "does not exist")
    j = json.loads(out)
    assert j["ok"] is False and j["error"]["code"] == "not_found", j
    rc, out, err = ctx.run("generate", "--json", "--model", ctx.path("missing.gguf"), "-p", "x")
    assert rc == 2 and json.loads(out)["error"]["code"] == "not_found", (rc, out, err)


@case
def bench_pause_ms_must_not_be_negative(ctx):
    rc, _, err = ctx.run("bench", "--pause-ms", "-5", "--model", "/nonexistent.gguf")
    expect(rc, err, 2, "--pause-ms")


def bench_process(ctx, doc_tokens, *extra):
    env = dict(os.environ, SWARMKV_CACHE=ctx.path("cache"))
    return subprocess.Popen([ctx.cli, "bench", "--model", ctx.model, "--doc-tokens", doc_tokens,
                             "--branches", "2", "--branch-tokens", "4", "--n-predict", "2",
                             "--arms", "none,shared", "--out", ctx.path("out"), *extra],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


@case
def bench_ctrl_c_ends_the_pause(ctx):
    p = bench_process(ctx, "64", "--trials", "3", "--pause-ms", "600000")
    try:
        for line in p.stderr:
            if "trial 1/3 arm shared" in line:  # the last arm of trial 1: the pause follows
                break
        time.sleep(0.5)  # inside the 10-minute pause now
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=10)
    finally:
        p.kill()
    assert rc == 130, f"exit {rc}"
    with open(ctx.path("out/best_run.json")) as f:
        assert json.load(f)["results"], "the finished trial is kept"


@case
def bench_second_ctrl_c_exits_at_once(ctx):
    p = bench_process(ctx, "512", "--trials", "50")
    try:
        for line in p.stderr:
            if "trial 1/50" in line:
                break
        p.send_signal(signal.SIGINT)
        time.sleep(0.2)
        start = time.monotonic()
        p.send_signal(signal.SIGINT)
        rc = p.wait(timeout=10)
        waited = time.monotonic() - start
    finally:
        p.kill()
    assert rc == 130, f"exit {rc}"
    assert waited < 2, f"took {waited:.1f} s after the second Ctrl-C"


def serve_process(ctx, *extra, model=None):
    """`swarmkv serve --port 0` (on `model`, else the test model) and the port it printed."""
    env = dict(os.environ, SWARMKV_CACHE=ctx.path("cache"))
    p = subprocess.Popen([ctx.cli, "serve", "--port", "0", "--model", model or ctx.model, *extra],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.match(r"swarmkv serve: http://127\.0\.0\.1:(\d+)/v1", line)
        if m:
            return p, int(m.group(1))
    p.kill()
    raise AssertionError(f"serve printed no address (exit {p.wait()})")


def http(port, path, body=None, timeout=60, headers=None):
    """A request as curl sends it: a JSON body with its Content-Type, and
    `headers` on top (Host, Origin, another Content-Type)."""
    import urllib.request
    data = json.dumps(body).encode() if body is not None else None
    sent = {"Content-Type": "application/json"} if data is not None else {}
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data,
                                 dict(sent, **(headers or {})))
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode()


def http_status(port, path, body=None, headers=None):
    """The status of a request that may be refused (urllib raises on 4xx/5xx)."""
    import urllib.error
    try:
        return http(port, path, body, timeout=10, headers=headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def stream_chat(port, body):
    """A streamed completion: its status and its data lines."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    c.request("POST", "/v1/chat/completions", json.dumps(dict(body, stream=True)),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    lines = [raw.decode().strip() for raw in r]
    return r.status, [line[6:] for line in lines if line.startswith("data: ")]


STORY = {"messages": [{"role": "user", "content": "Write a long story about a cat."}],
         "max_tokens": 64, "temperature": 0}


def sigterm_during(ctx, drain, request, while_draining=None):
    """`serve --drain DRAIN`; request(port) in a thread, SIGTERM once it is
    being decoded, then while_draining(port) (if given). Returns serve's
    exit status, the request's result and while_draining's."""
    import threading
    p, port = serve_process(ctx, "--drain", str(drain))
    try:
        out = {}
        t = threading.Thread(target=lambda: out.update(r=request(port)))
        t.start()
        for _ in range(200):  # until the request is being decoded
            if re.search(r"^swarmkv_live_sequences 1$", http(port, "/metrics")[1], re.M):
                break
            time.sleep(0.05)
        else:
            raise AssertionError("no request became live")
        p.send_signal(signal.SIGTERM)
        during = None
        if while_draining:
            time.sleep(0.2)
            during = while_draining(port)
        t.join(timeout=120)
        rc = p.wait(timeout=60)
    finally:
        p.kill()
    return rc, out.get("r"), during


@case
def serve_drains_on_sigterm(ctx):
    rc, (status, text), _ = sigterm_during(
        ctx, 60, lambda port: http(port, "/v1/chat/completions", STORY))
    assert rc == 0, f"exit {rc}"
    assert status == 200, status
    assert json.loads(text)["usage"]["completion_tokens"] == 64, text


PROMETHEUS_PARSE = """
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append([family.name, family.type, s.name, s.labels, s.value])
print(json.dumps(out))
"""


def prometheus_samples(text):
    """/metrics as prometheus_client's parser reads it (Debian's python3-prometheus-client:
    /usr/bin/python3 when the tests' interpreter lacks it)."""
    for python in (sys.executable, "/usr/bin/python3"):
        p = subprocess.run([python, "-c", PROMETHEUS_PARSE], input=text, capture_output=True,
                           text=True, timeout=60)
        if "No module named 'prometheus_client'" not in p.stderr:
            assert p.returncode == 0, f"prometheus_client refused the exposition:\n{p.stderr}\n{text}"
            return json.loads(p.stdout)
    raise AssertionError("prometheus_client is not installed (scripts/lib.sh installs it)")


# A request to /a%22b%5C put its raw path into a label: the exposition no
# longer parsed, and every unknown path added a series. Routes are labelled
# by their template now ("other" for none), every label value escaped; the
# build is a metric; each request is one info line in the log.
@case
def metrics_parse_whatever_paths_clients_ask_for(ctx):
    p, port = serve_process(ctx, "--header-timeout", "0.5")  # serve logs at info by default
    try:
        for path in ("/a%22b%5C", "/x%0Ay", "/v1/nope", "/health"):
            http_status(port, path)
        status, _ = http(port, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
        assert status == 200
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /hea")  # and no more: 408 after --header-timeout
            answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout"), answer
        assert b'"code":"request_timeout"' in answer, answer
        samples = prometheus_samples(http(port, "/metrics")[1])
    finally:
        p.terminate()
        log = p.communicate(timeout=60)[1]
    responses = {(s[3]["route"], s[3]["status"]): s[4] for s in samples
                 if s[2] == "swarmkv_http_responses_total"}
    assert responses == {("other", "404"): 3.0, ("/health", "200"): 1.0,
                         ("/v1/chat/completions", "200"): 1.0}, responses
    build = [s for s in samples if s[2] == "swarmkv_build_info"]
    assert len(build) == 1 and build[0][4] == 1.0 and build[0][1] == "gauge", build
    assert re.fullmatch(r"\d+\.\d+\.\d+", build[0][3]["version"]), build
    assert re.fullmatch(r"[0-9a-f]{7,40}", build[0][3]["llama_commit"]), build
    names = {s[0] for s in samples}
    assert "swarmkv_kv_cells_capacity" in names and "swarmkv_kv_cells_total" not in names, names
    value = {s[2]: s[4] for s in samples if not s[3]}
    assert value["swarmkv_http_head_timeouts_total"] == 1.0, value
    assert value["swarmkv_http_connections_refused_total"] == 0.0, value
    assert value["swarmkv_http_connections_open"] >= 1.0, value  # the /metrics request's own
    assert re.search(r"http GET other 404 \d+\.\d ms", log), log
    assert re.search(r"http POST /v1/chat/completions 200 \d+\.\d ms prompt_tokens \d+ "
                     r"cached_tokens \d+ completion_tokens 2\b", log), log


# A web page must not drive the server: a Host that is not the server's
# (DNS rebinding) and an Origin of another site get 403 on every route but
# /health, a POST body that is not JSON 415 (a page can send text/plain to
# any server without asking); --allow-host and --allow-origin widen the
# rules. A same-origin client, or one that sends no Origin, is answered.
# (serve read any body as JSON and looked at neither header.)
@case
def serve_refuses_other_sites_and_bodies_that_are_not_json(ctx):
    p, port = serve_process(ctx, "--allow-host", "proxy.example", "--allow-origin",
                            "https://app.example")
    hi = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    try:
        refused = {
            "/v1/models": {"Host": f"evil.example:{port}"},
            "/": {"Host": "evil.example"},
            "/v1/pipelines/1": {"Host": "127.0.0.1.evil.example"},
        }
        for path, headers in refused.items():
            status, body = http_status(port, path, headers=headers)
            assert status == 403 and json.loads(body)["error"]["code"] == "forbidden_host", \
                (path, status, body)
        for origin in (f"http://evil.example:{port}", "null", f"http://localhost:{port + 1}"):
            status, body = http_status(port, "/v1/chat/completions", hi, {"Origin": origin})
            assert status == 403 and json.loads(body)["error"]["code"] == "forbidden_origin", \
                (origin, status, body)
        for ctype in ("text/plain", "application/x-www-form-urlencoded"):
            status, body = http_status(port, "/v1/chat/completions", hi, {"Content-Type": ctype})
            assert status == 415, (ctype, status, body)
            assert json.loads(body)["error"]["message"] == (
                f"body: Content-Type '{ctype}'; send the request as one JSON object with the "
                "header 'Content-Type: application/json'"), body
        assert http_status(port, "/health", headers={"Host": "evil.example"})[0] == 200
        answered = [
            ("/v1/models", None, {}),
            ("/v1/models", None, {"Host": f"localhost:{port}"}),
            ("/v1/models", None, {"Host": "proxy.example"}),
            ("/v1/chat/completions", hi, {"Origin": f"http://127.0.0.1:{port}"}),
            ("/v1/chat/completions", hi, {"Origin": "https://app.example"}),
            ("/v1/chat/completions", hi, {"Content-Type": "application/json; charset=utf-8"}),
        ]
        for path, body, headers in answered:
            status, text = http_status(port, path, body, headers)
            assert status == 200, (path, headers, status, text)
    finally:
        p.terminate()
        p.communicate(timeout=60)


def get_with_connection(port, path):
    """GET path: its status and its Connection header."""
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", path)
        r = c.getresponse()
        r.read()
        return r.status, r.getheader("Connection")
    finally:
        c.close()


# A stream in flight at SIGTERM runs to its end within --drain, while the
# listener answers /health with 503 "draining" and new work with 503; one
# still running at the deadline ends with an error event and [DONE]. (Both
# streams were cut at once, and /health refused connections.) The GET
# routes keep answering, each answer closing its connection (they answered
# as if nothing happened).
@case
def serve_drains_streams_and_says_so(ctx):
    rc, (status, lines), (health, refused, models) = sigterm_during(
        ctx, 60, lambda port: stream_chat(port, STORY),
        lambda port: (http_status(port, "/health"),
                      http_status(port, "/v1/chat/completions", STORY),
                      get_with_connection(port, "/v1/models")))
    assert rc == 0, f"exit {rc}"
    assert health[0] == 503 and json.loads(health[1]) == {"status": "draining"}, health
    assert refused[0] == 503, refused
    assert json.loads(refused[1])["error"]["message"] == "the server is shutting down", refused
    assert models == (200, "close"), models
    assert status == 200 and lines[-1] == "[DONE]", lines[-3:]
    chunks = [json.loads(x) for x in lines[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop"), chunks[-1]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    p, port = serve_process(ctx)  # the same completion, not streamed
    try:
        plain = json.loads(http(port, "/v1/chat/completions", STORY)[1])
    finally:
        p.terminate()
        p.wait(timeout=60)
    assert text == plain["choices"][0]["message"]["content"], (text, plain)

    rc, (status, lines), _ = sigterm_during(
        ctx, 0, lambda port: stream_chat(port, dict(STORY, max_tokens=2000)))
    assert rc == 0, f"exit {rc}"
    assert status == 200 and lines[-1] == "[DONE]", lines[-3:]
    assert json.loads(lines[-2])["error"]["message"] == "the server is shutting down", lines[-3:]


@case
def serve_names_a_busy_port(ctx):
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    rc, _, err = ctx.run("serve", "--port", str(port), "--model", ctx.model)
    expect(rc, err, 1, f"io: cannot listen on 127.0.0.1:{port} (in use, or no such local "
                       "address)")


# ------------------------------------------------------------------ pipeline files


@case
def json_pipeline_with_surrogate_pairs_is_read_as_json(ctx):
    """What Python's json writes for an emoji: a surrogate pair escape."""
    spec = {"name": "review \U0001F680", "document": {"text": "A doc \U0001F4C4"},
            "agents": [{"name": "a\U0001F389", "prompt": "Say \U0001F600"}]}
    p = ctx.write("emoji.json", json.dumps(spec))
    assert "\\ud83d\\ude80" in open(p).read()
    rc, out, err = ctx.run("run", p, "--check")
    assert rc == 0, f"exit {rc}: {err}"
    assert out == f"{p}: pipeline 'review \U0001F680' is valid: 1 agents, fork shared, document 10 bytes\n", out


@case
def check_of_100k_agents_takes_linear_time(ctx):
    """100,000 agents, each forking from the one before and naming the first and
    the one before in its prompt: every graph check is a look-up, not a scan
    (this took 30 s when names were found by a linear search)."""
    n = 100000
    agents = [{"name": "a0", "prompt": "q"}]
    agents += [{"name": f"a{i}", "prompt": f"{{{{a0}}}} and {{{{a{i - 1}}}}}", "depends_on": f"a{i - 1}",
                "fork_from": f"a{i - 1}"} for i in range(1, n)]
    p = ctx.write("many.json", json.dumps({"document": "x", "agents": agents}))
    start = time.monotonic()
    # ASan/UBSan slows every step about 4x (20.5 s here where release takes 5.4 s): the sanitizer
    # presets scale the bound (SWARMKV_TIME_FACTOR); a quadratic check still exceeds it there.
    rc, out, err = ctx.run("run", p, "--check", timeout=20 * float(os.environ.get("SWARMKV_TIME_FACTOR", "1")))
    took = time.monotonic() - start
    assert rc == 0, f"exit {rc}: {err}"
    assert f"is valid: {n} agents" in out, out
    print(f"run --check of {n} agents: {took:.2f} s")


# ------------------------------------------------------------------ serve's key


@case
def an_empty_api_key_is_refused(ctx):
    """`--api-key "$KEY"` with KEY unset must not turn auth off."""
    rc, _, err = ctx.run("serve", "--model", "/nonexistent.gguf", "--api-key", "")
    expect(rc, err, 2, "--api-key is empty (an unset variable?): give a key, or leave --api-key out "
                       "to serve without one")
    rc, _, err = ctx.run("serve", "--model", "/nonexistent.gguf", env={"SWARMKV_API_KEY": ""})
    expect(rc, err, 2, "$SWARMKV_API_KEY is set but empty: give a key, or unset it to serve without one")


@case
def serving_off_loopback_without_a_key_warns(ctx):
    warning = ("without --api-key: anyone who can reach this port can use the model and read every "
               "posted run")
    for host in ("0.0.0.0", "::", "192.168.1.7"):
        rc, _, err = ctx.run("serve", "--model", "/nonexistent.gguf", "--host", host)
        expect(rc, err, 2, "does not exist")  # started: the warning comes before the model
        assert f"serve: listening on {host} {warning}" in err, err
    for args in (["--host", "127.0.0.1"], ["--host", "localhost"], ["--host", "::1"],
                 ["--host", "0.0.0.0", "--api-key", "k"]):
        rc, _, err = ctx.run("serve", "--model", "/nonexistent.gguf", *args)
        expect(rc, err, 2, "does not exist")
        assert warning not in err, (args, err)


# ------------------------------------------------------------------ engine settings


@case
def engine_settings_are_checked_before_the_model_loads(ctx):
    p = ctx.write("p.yaml", "document: {text: x}\n" + GOOD_AGENTS)
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--no-exact", "--flash-attn", "off",
                         "--kv-type", "q8_0")
    expect(rc, err, 2, "kv_type q8_0 needs flash attention: at this llama.cpp a quantised V cache works only "
                       "with flash_attn on")
    for cmd in (["run", p], ["serve"]):
        rc, _, err = ctx.run(*cmd, "--model", "/nonexistent.gguf", "--flash-attn", "off")
        expect(rc, err, 2, "--flash-attn off: exact mode (the default) runs on flash attention; add --no-exact")
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--n-ubatch", "1024")
    expect(rc, err, 2, "n_ubatch must be 0 (automatic) or divide n_batch 512 (got 1024)")
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--n-ubatch", "100")
    expect(rc, err, 2, "n_ubatch must be 0 (automatic) or divide n_batch 512 (got 100)")
    rc, _, err = ctx.run("run", p, "--model", "/nonexistent.gguf", "--threads-batch", "100000")
    expect(rc, err, 2, "(got 100000)")
    rc, out, err = ctx.run("run", p, "--check", "--flash-attn", "on", "--kv-type", "q8_0", "-b", "256",
                           "--n-ubatch", "128")
    assert rc == 0 and "is valid: 1 agents" in out, f"exit {rc}: {out} {err}"
    doc = ctx.write("doc.txt", "A document.")
    rc, _, err = ctx.run("prefill", doc, "--model", "/nonexistent.gguf", "--no-exact", "--flash-attn", "off", "--kv-type",
                         "q8_0")
    expect(rc, err, 2, "kv_type q8_0 needs flash attention")


@case
def info_names_slow_weight_types(ctx):
    """ctx.model: the shipped Q4_1 file (no fast prefill kernel on x86); argv[5]: a variant that has one."""
    rc, out, err = ctx.run("info", "--model", ctx.model)
    assert rc == 0, f"exit {rc}: {err}"
    weights = json.loads(out)["weights"]
    assert weights["types"][0]["type"] == "q4_1" and not weights["types"][0]["fast_prefill"], weights
    hint = weights["hint"]
    assert hint and "(q4_1) have no fast prefill kernel on this CPU" in hint, weights
    assert "hint: " + hint in err, err
    rc, out, err = ctx.run("info", "--model", sys.argv[5])
    assert rc == 0, f"exit {rc}: {err}"
    weights = json.loads(out)["weights"]
    assert weights["hint"] is None and all(w["fast_prefill"] for w in weights["types"]), weights
    assert "hint:" not in err, err


# ------------------------------------------------------------------ repacked weights

REPACK_DOCUMENT = " ".join(
    f"Clause {i}. The tenant pays {100 + 7 * i} EUR on day {i % 28 + 1} of each month; "
    f"late payment costs {i % 5 + 1} percent a week, and notice is {i % 3 + 1} months."
    for i in range(1, 25))

REPACK_AGENTS = """defaults: {max_tokens: 12, top_logprobs: 2}
agents:
  - {name: rent, prompt: "What does the tenant pay under clause 3?"}
  - {name: late, prompt: "What does late payment cost under clause 7?"}
  - {name: notice, prompt: "What notice does clause 11 give?"}
  - {name: day, prompt: "On which day is clause 20's rent due?"}
  - {name: sum, prompt: "Name two clauses and their sums."}
"""


def cpu_repacks_q4_0():
    """Whether ggml repacks Q4_0 on this CPU: x86 with AVX2, ARM with dot products."""
    with open("/proc/cpuinfo") as f:
        flags = set()
        for line in f:
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[1].split())
    return "avx2" in flags or "asimddp" in flags


@case
def exact_q4_0_repacked_answers_equal_a_re_prefill(ctx):
    """argv[5]: llama-quantize of the llama.cpp we build against; SWARMKV_TEST_QUANT (default
    Q4_0) the weight type made from the F16 test model. Exact mode repacks Q4_0 for ggml's int8
    gemm (four agents' rows at once) and gemv (the rest): every agent's tokens and log
    probabilities, bits included, are the same under shared, host and none, and through serve
    a chat's are the same asked alone and among five at once."""
    quant = os.environ.get("SWARMKV_TEST_QUANT", "Q4_0")
    model = ctx.path(f"model.{quant}.gguf")
    q = subprocess.run([sys.argv[5], ctx.model, model, quant], capture_output=True, timeout=120)
    assert q.returncode == 0, q.stderr.decode("utf-8", "replace")[-2000:]
    ctx.write("doc.txt", REPACK_DOCUMENT)
    pipeline = ctx.write("p.yaml", "document: {file: doc.txt}\n" + REPACK_AGENTS)
    agents = {}
    for fork in ("shared", "host", "none"):
        rc, out, err = ctx.run("run", pipeline, "--model", model, "--fork", fork, "--json",
                               env={"SWARMKV_LOG_LEVEL": "debug"} if fork == "shared" else None)
        assert rc == 0, f"exit {rc}: {err[-2000:]}"
        if fork == "shared" and cpu_repacks_q4_0():
            # llama.cpp's load report: the weights went to the repack buffer.
            assert re.search(r"CPU_REPACK model buffer size = +[1-9]", err), \
                "exact mode loaded the weights without repacking: " + err[-2000:]
        agents[fork] = [(a["name"], a["tokens"], a["logprobs"]) for a in json.loads(out)["agents"]]
        assert len(agents[fork]) == 5 and all(a[1] for a in agents[fork]), agents[fork]
    assert agents["shared"] == agents["none"], "shared differs from none"
    assert agents["host"] == agents["none"], "host differs from none"
    # serve's door: each question asked alone first (--max-cached 0: nothing kept to fork, so
    # its whole prompt is prefilled and its steps are one row), then all five at once on a
    # server that forks the document and steps them in one batch (the repacked gemm's columns in
    # fours, the gemv the rest): the same tokens and log probabilities, bits included.
    questions = re.findall(r'prompt: "([^"]+)"', REPACK_AGENTS)
    bodies = [{"messages": [{"role": "user", "content": REPACK_DOCUMENT + "\n\n" + q}],
               "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 2}
              for q in questions]

    def answers(concurrently, *extra):  # no snapshot store: the runs above filled one
        srv, port = serve_process(ctx, "--snapshot-cache", "off", *extra, model=model)
        try:
            with concurrent.futures.ThreadPoolExecutor(len(bodies) if concurrently else 1) as pool:
                got = list(pool.map(lambda b: json.loads(
                    http(port, "/v1/chat/completions", b, timeout=120)[1]), bodies))
            reused = re.search(r"^swarmkv_reused_tokens_total (\S+)", http(port, "/metrics")[1], re.M)
            return got, float(reused.group(1))
        finally:
            srv.kill()
            srv.wait(10)

    alone, reused_alone = answers(False, "--max-cached", "0")
    together, reused_together = answers(True)
    assert reused_alone == 0 and reused_together > 0, (reused_alone, reused_together)
    for q, a, b in zip(questions, alone, together):
        assert a["choices"][0]["message"] == b["choices"][0]["message"], (q, a, b)
        assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"], f"{q}: logprobs differ"


# ------------------------------------------------------------------ a corpus

CORPUS_AGENTS = """defaults: {max_tokens: 12}
agents:
  - {name: sum, prompt: "What sum of money does the document mention? One line."}
  - name: biggest
    scope: corpus
    prompt: "The sums:\n{{sum[*]}}\n\nWhich is the largest? One line."
"""


@case
def corpus_bad_inputs_are_refused_before_any_work(ctx):
    ctx.write("a.txt", "The rent is 900 EUR.\n")
    ctx.write("b.txt", "The fee is 40 EUR.\n")
    os.makedirs(ctx.path("more"))
    ctx.write("more/a.txt", "The price is 3 EUR.\n")
    ctx.write("bin.txt", b"PK\x03\x04\x00\x00binary")
    os.symlink(ctx.path("gone.txt"), ctx.path("dangling.txt"))
    p = ctx.write("c.yaml", "documents: [a.txt, b.txt]\n" + CORPUS_AGENTS)
    bad = "/nonexistent.gguf"
    cases = [
        (["--document", "*.pdf"], "--document *.pdf: '*.pdf' matches no file"),
        (["--document", "a.txt", "--document", "bin.txt"],
         "is a binary file (a NUL byte at offset 4); documents are text"),
        (["--document", "a.txt", "--document", "more/a.txt"], "two documents are named 'a.txt'"),
        (["--document", "dangling.txt"], "dangling.txt' does not exist"),
    ]
    for args, words in cases:
        rc, out, err = ctx.run("run", p, "--model", bad, *args)
        expect(rc, err, 2, words)
    # The file's own list: a glob with no match names the item.
    q = ctx.write("q.yaml", "documents: [a.txt, 'none/*.txt']\n" + CORPUS_AGENTS)
    rc, out, err = ctx.run("run", q, "--model", bad)
    expect(rc, err, 2, "q.yaml: documents[1]: 'none/*.txt' matches no file")
    # A reduce agent that names a per-document agent without saying which documents.
    r = ctx.write("r.yaml", "documents: [a.txt]\n" + CORPUS_AGENTS.replace("{{sum[*]}}", "{{sum}}"))
    rc, out, err = ctx.run("run", r, "--model", bad)
    expect(rc, err, 2, "{{sum}} names 'sum', an agent that runs once per document: take {{sum[*]}}")
    r = ctx.write("r2.yaml", "documents: [a.txt]\n" + CORPUS_AGENTS.replace("{{sum[*]}}", "{{sum@c.txt}}"))
    rc, out, err = ctx.run("run", r, "--model", bad)
    expect(rc, err, 2, "{{sum@c.txt}}: no document is named 'c.txt'")
    # scope: corpus in a pipeline of one document under serve's reader is refused; under run
    # it is a corpus of one. --out needs a corpus.
    one = ctx.write("one.yaml", "document: {text: The rent is 900 EUR.}\n" + GOOD_AGENTS)
    rc, out, err = ctx.run("run", one, "--model", bad, "--out", "o")
    expect(rc, err, 2, "--out keeps the result of each document of a corpus")
    rc, out, err = ctx.run("run", p, "--check")
    assert rc == 0 and "2 documents, 1 agents per document, 1 reduce agents" in out, (rc, out, err)


def corpus_answers(result):
    """Every answer of a corpus result, documents in order, then the reduce agents'."""
    out = [(d["name"], a["name"], a["answer"]) for d in result["documents"]
           for a in d["result"]["agents"]]
    return out + [("*", a["name"], a["answer"]) for a in result["reduce"]["agents"]]


@case
def corpus_resumes_after_sigkill(ctx):
    """SIGKILL after some documents, the same command again: the final result equals an
    uninterrupted run's, and no finished document runs again."""
    names = []
    for i in range(8):
        names.append(ctx.write(f"doc{i}.txt", f"Contract {i}. The buyer pays {100 * (i + 1)} EUR "
                                              f"within {i + 2} weeks. " * 6 + "\n"))
    p = ctx.write("c.yaml", "documents: ['doc*.txt']\n" + CORPUS_AGENTS)
    base = ["run", p, "--model", ctx.model, "--json", "--snapshot-cache", "off"]
    rc, out, err = ctx.run(*base, "--out", "whole")
    assert rc == 0, err
    whole = json.loads(out)
    assert whole["documents_run"] == 8 and whole["documents_resumed"] == 0, whole
    env = dict(os.environ, SWARMKV_CACHE=ctx.path("cache"))
    env.pop("SWARMKV_LOG_LEVEL", None)
    child = subprocess.Popen([ctx.cli, *base, "--out", "cut"], cwd=ctx.tmp, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done_dir = ctx.path("cut/documents")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and child.poll() is None:
        if os.path.isdir(done_dir) and len([f for f in os.listdir(done_dir) if f.endswith(".json")]) >= 3:
            break
        time.sleep(0.02)
    assert child.poll() is None, "the run ended before it could be killed: make the documents longer"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    kept = [f for f in os.listdir(done_dir) if f.endswith(".json")]
    assert 3 <= len(kept) < 8, kept
    rc, out, err = ctx.run(*base, "--out", "cut")
    assert rc == 0, err
    resumed = json.loads(out)
    assert resumed["documents_resumed"] == len(kept), (resumed["documents_resumed"], kept)
    assert resumed["documents_run"] == 8 - len(kept), resumed["documents_run"]
    assert corpus_answers(resumed) == corpus_answers(whole)
    print(f"killed after {len(kept)} of 8 documents; the second run ran {resumed['documents_run']}")
    # Progress on a terminal only: a third run, every document resumed.
    assert "corpus: " not in err, err
    rc, shown = on_a_terminal(ctx, *base, "--out", "cut")
    assert rc == 0, shown
    assert "corpus: 8/8 documents (8 resumed, 0 failed), 8 agents answered | doc7.txt" in shown, shown
    # Standard input is a document too.
    with open(names[0]) as f:
        text = f.read()
    p2 = subprocess.run([ctx.cli, "run", p, "--model", ctx.model, "--json", "--document", "-"],
                        input=text.encode(), cwd=ctx.tmp, env=env, capture_output=True, timeout=120)
    assert p2.returncode == 0, p2.stderr
    stdin_run = json.loads(p2.stdout)
    assert stdin_run["documents"][0]["name"] == "stdin"
    assert [a["answer"] for a in stdin_run["documents"][0]["result"]["agents"]] == \
        [a["answer"] for a in whole["documents"][0]["result"]["agents"]]


def main():
    name, cli, source = sys.argv[1:4]
    model = sys.argv[4] if len(sys.argv) > 4 else None
    with tempfile.TemporaryDirectory(prefix=f"swarmkv-{name}-") as tmp:
        CASES[name](Ctx(cli, source, model, tmp))
    print(f"{name}: ok")


if __name__ == "__main__":
    main()
