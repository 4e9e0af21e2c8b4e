#!/usr/bin/env python3
"""The cluster end to end: redis-server, `swarmkv worker`s and `swarmkv run --redis`.

    cluster_cli.py CASE SWARMKV_BINARY SOURCE_DIR MODEL REDIS_SERVER

Each case starts its own redis-server on a free loopback port (persistence
off) and its own workers, each with a snapshot store of its own, and stops
every process it started, also when the case fails. Every wait is bounded.
The pipeline is the README's (examples/pipelines/apache-license.yaml) for
the answer cases and a smaller cut of it for the fault cases; a worker runs with one thread so that two of them share this machine's cores.
"""
import hashlib
import hmac
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time

CASES = {}
# The most threads a process may use here (the tsan preset caps it at 1).
MAX_THREADS = min(2, int(os.environ.get("SWARMKV_MAX_THREADS", "2")))


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, pred, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


class Cluster:
    def __init__(self, cli, source, model, redis_server, tmp):
        self.cli, self.source, self.model, self.redis_server, self.tmp = (
            cli, source, model, redis_server, tmp)
        self.pipeline = os.path.join(source, "examples", "pipelines", "apache-license.yaml")
        self.port = free_port()
        self.redis = None
        self.redis_args = []
        self.tls = None  # use_tls(): the folder of the test certificates
        self.workers = {}
        self.children = []

    def use_small_pipeline(self):
        """The README pipeline on the licence's first 3,000 characters with
        24-token answers, for the fault cases: a job still takes a second
        or more (far longer than a fault takes to inject after its claim),
        a quarter of the README run."""
        with open(os.path.join(self.source, "examples", "documents", "apache-2.0.txt")) as f:
            document = f.read()[:3000]
        with open(self.pipeline) as f:
            spec = f.read()
        doc = os.path.join(self.tmp, "document.txt")
        with open(doc, "w") as f:
            f.write(document)
        spec = spec.replace("file: ../documents/apache-2.0.txt", f"file: {doc}")
        spec = spec.replace("max_tokens: 96", "max_tokens: 24")
        assert doc in spec and "max_tokens: 24" in spec, "the README pipeline changed"
        self.pipeline = os.path.join(self.tmp, "small.yaml")
        with open(self.pipeline, "w") as f:
            f.write(spec)

    def use_pipeline(self, name, body):
        """A pipeline over the licence's first 3,000 characters: `body` is
        the YAML after the document line (defaults, agents)."""
        with open(os.path.join(self.source, "examples", "documents", "apache-2.0.txt")) as f:
            document = f.read()[:3000]
        doc = os.path.join(self.tmp, "document.txt")
        with open(doc, "w") as f:
            f.write(document)
        self.pipeline = os.path.join(self.tmp, f"{name}.yaml")
        with open(self.pipeline, "w") as f:
            f.write(f"document: {{file: {doc}}}\n" + body)

    def use_tls(self):
        """Redis on a TLS port only, asking every client for a certificate of
        the test CA; url() carries the CA and the client certificate."""
        self.tls = os.path.join(self.tmp, "certs")
        subprocess.run(["bash", os.path.join(self.source, "tests", "make_test_certificates.sh"),
                        self.tls], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def tls_file(self, name):
        return os.path.join(self.tls, name)

    def url(self, userinfo=""):
        auth = userinfo + "@" if userinfo else ""
        if not self.tls:
            return f"redis://{auth}127.0.0.1:{self.port}"
        return (f"rediss://{auth}127.0.0.1:{self.port}?cacert={self.tls_file('test-ca.pem')}"
                f"&cert={self.tls_file('client.pem')}&key={self.tls_file('client.key')}")

    def env(self):
        env = dict(os.environ)
        env.pop("SWARMKV_LOG_LEVEL", None)
        env.pop("SWARMKV_REDIS", None)
        env["SWARMKV_CACHE"] = os.path.join(self.tmp, "cache")
        env["SWARMKV_MODEL"] = self.model
        return env

    def start_redis(self, *extra):
        self.redis_args = list(extra) or self.redis_args
        listen = ["--port", str(self.port)]
        if self.tls:
            listen = ["--port", "0", "--tls-port", str(self.port),
                      "--tls-cert-file", self.tls_file("server.pem"),
                      "--tls-key-file", self.tls_file("server.key"),
                      "--tls-ca-cert-file", self.tls_file("test-ca.pem"), "--tls-auth-clients", "yes"]
        self.redis = subprocess.Popen(
            [self.redis_server, *listen, "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--loglevel", "warning", *self.redis_args],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.children.append(self.redis)

        def up():
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return True
            except OSError:
                return False
        wait_for("redis-server to listen", up, 10)

    def kill_redis(self):
        self.redis.kill()
        self.redis.wait(10)

    def redis_cmd(self, *args, password=None):
        """One command over a raw socket (RESP), for the fault cases; over
        TLS with the client certificate after use_tls()."""
        raw = socket.create_connection(("127.0.0.1", self.port), 5)
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.tls_file("test-ca.pem"))
            ctx.load_cert_chain(self.tls_file("client.pem"), self.tls_file("client.key"))
            raw = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        with raw as s:
            def send(parts):
                out = f"*{len(parts)}\r\n".encode()
                for p in parts:
                    p = p if isinstance(p, bytes) else str(p).encode()
                    out += f"${len(p)}\r\n".encode() + p + b"\r\n"
                s.sendall(out)
                reply = s.recv(1 << 20)
                # A bulk reply may come in several reads (TLS records of 16 KiB).
                if reply.startswith(b"$") and not reply.startswith(b"$-1"):
                    head, _, _ = reply.partition(b"\r\n")
                    while len(reply) < len(head) + 2 + int(head[1:]) + 2:
                        reply += s.recv(1 << 20)
                return reply
            if password:
                send(["AUTH", password])
            return send(list(args))

    def start_worker(self, name, *extra, threads=1):
        log = open(os.path.join(self.tmp, f"{name}.log"), "w")
        p = subprocess.Popen(
            [self.cli, "worker", "--redis", self.url(), "--name", name, "-t", str(threads),
             "--cache-dir", os.path.join(self.tmp, f"store-{name}"), *extra],
            env=self.env(), stdout=log, stderr=subprocess.STDOUT)
        self.children.append(p)
        self.workers[name] = p
        wait_for(f"worker {name} to serve",
                 lambda: "serving model" in self.log(name) or p.poll() is not None, 60)
        assert p.poll() is None, f"worker {name} exited: {self.log(name)}"
        return p

    def log(self, name):
        with open(os.path.join(self.tmp, f"{name}.log")) as f:
            return f.read()

    def run(self, *args, timeout=600):
        p = subprocess.run([self.cli, "run", self.pipeline, *args], env=self.env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")

    def start_run(self, *args):
        out = open(os.path.join(self.tmp, "run.out"), "w")
        err = open(os.path.join(self.tmp, "run.err"), "w")
        p = subprocess.Popen([self.cli, "run", self.pipeline, *args], env=self.env(),
                             stdout=out, stderr=err)
        self.children.append(p)
        return p

    def finish_run(self, p, timeout):
        rc = p.wait(timeout)
        with open(os.path.join(self.tmp, "run.out")) as f:
            out = f.read()
        with open(os.path.join(self.tmp, "run.err")) as f:
            err = f.read()
        return rc, out, err

    def local(self, fork):
        rc, out, err = self.run("--fork", fork, "--json", "--snapshot-cache", "off")
        assert rc == 0, err
        return json.loads(out)

    def stop_all(self):
        for p in self.children:
            if p.poll() is None:
                p.kill()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    pass


def agents_by_name(result):
    return {a["name"]: a for a in result["agents"]}


def expect_equal_answers(remote, local):
    r, l = agents_by_name(remote), agents_by_name(local)
    assert sorted(r) == sorted(l), (sorted(r), sorted(l))
    for name in l:
        assert r[name]["status"] == "ok", r[name]
        assert r[name]["tokens"] == l[name]["tokens"], (
            f"agent {name}: remote answer {r[name]['answer']!r} != local {l[name]['answer']!r}")


def stop_worker(c, name):
    p = c.workers[name]
    p.send_signal(signal.SIGTERM)
    assert p.wait(60) == 0, c.log(name)


@case
def host_answers_equal_local(c):
    """Two workers + a coordinator, --fork host: every answer token for token the local one's
    (on the quarter-size README pipeline: the fork-equivalence tests cover the whole one)."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    first = json.loads(out)
    local = c.local("host")
    expect_equal_answers(first, local)
    workers = {a["worker"] for a in first["agents"]}
    assert workers == {"w1", "w2"}, f"both workers get a job: {workers}"
    t = first["transfer"]
    # A worker prefilled the document and published it (the coordinator
    # never decodes); the other worker fetched it.
    assert first["snapshot"]["source"] == "prefill" and first["document_prefills"] == 1, first["snapshot"]
    assert first["prefill_ms"] > 0, first
    assert t["bytes"] > 1_000_000 and t["publish_ms"] > 0 and t["fetches"] == 1 and t["fetch_ms"] > 0, t
    assert sum("published snapshot" in c.log(w) for w in ("w1", "w2")) == 1
    # Again: Redis has the snapshot (no prefill, no publish), the workers
    # their local copies (no fetch).
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    second = json.loads(out)
    expect_equal_answers(second, local)
    assert second["snapshot"]["source"] == "redis" and second["document_prefills"] == 0, second["snapshot"]
    assert second["transfer"]["publish_ms"] == 0 and second["transfer"]["fetches"] == 0, second["transfer"]
    # The text output names each agent's worker and the transfer.
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--timeout", "300")
    assert rc == 0, err
    assert "worker w1) ==" in out and "worker w2) ==" in out and "transfer: snapshot " in out, out
    stop_worker(c, "w1")
    stop_worker(c, "w2")
    assert "claimed job" in c.log("w1") and "claimed job" in c.log("w2"), c.log("w1")
    assert sum("fetched snapshot" in c.log(w) for w in ("w1", "w2")) == 1


def signed(key, text):
    """HMAC-SHA256 as swarmkv::cluster::ClusterKey::sign computes it."""
    return hmac.new(key.encode(), text.encode(), hashlib.sha256).hexdigest()


def entry_signature(key, stream, fields):
    """What a stream entry's signature covers (cluster_key.cpp: entry_signed_text)."""
    text = "swarmkv stream entry\n" + f"{len(stream.encode())}:{stream}"
    for name in sorted(fields):
        value = fields[name]
        text += f"{len(name.encode())}:{name}{len(value.encode())}:{value}"
    return signed(key, text)


@case
def a_keyed_cluster_answers_as_an_open_one_and_refuses_other_keys(c):
    """Two workers and the run holding one cluster key, all speaking TLS to
    a Redis that has no plain port and asks for client certificates: the
    answers a local run's, and the workers' pool one of their own. A job in
    that pool signed with another key, or unsigned, is refused by name and
    never run; a snapshot manifest on the bus signed with another key is
    refused and published again; a run whose key no worker holds fails at
    once naming the key's id."""
    c.use_small_pipeline()
    c.use_tls()
    c.start_redis()
    key, other = "a" * 64, "b" * 64
    files = {}
    for name, value in (("key", key), ("other", other), ("third", "c" * 64)):
        files[name] = os.path.join(c.tmp, name)
        with open(files[name], "w") as f:
            f.write(value + "\n")
    c.start_worker("w1", "--cluster-key-file", files["key"])
    c.start_worker("w2", "--cluster-key-file", files["key"])
    c.start_worker("intruder", "--cluster-key-file", files["other"])
    for w in ("w1", "w2", "intruder"):
        assert "no cluster key" not in c.log(w), c.log(w)
        assert f"from rediss://127.0.0.1:{c.port}" in c.log(w), c.log(w)
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300",
                         "--cluster-key-file", files["key"])
    assert rc == 0, err
    assert "no cluster key" not in err, err
    first = json.loads(out)
    expect_equal_answers(first, c.local("host"))
    assert {a["worker"] for a in first["agents"]} == {"w1", "w2"}, first["agents"]
    assert "claimed job" not in c.log("intruder") and "refusing" not in c.log("intruder")

    # Jobs written into the keyed pool by someone without its key.
    key_id = signed(key, "swarmkv key id")[:16]
    stream = f"swarmkv:jobs:{model_sha256(c.model)}:k{key_id}:exact"
    spec = {"pipeline": {"document": {"text": "A short document."}, "fork": "none",
                         "agents": [{"name": "a", "prompt": "Say hi.", "max_tokens": 4}]},
            "document_source": "text", "guard": "serialized"}
    c.redis_cmd("SET", "swarmkv:run:forged:spec", json.dumps(spec))
    forged = {"run": "forged", "agents": '["a"]'}
    other_signed = dict(forged, sig=entry_signature(other, stream, forged))
    ids = [c.redis_cmd("XADD", stream, "*", *[x for kv in other_signed.items() for x in kv]),
           c.redis_cmd("XADD", stream, "*", *[x for kv in forged.items() for x in kv])]
    ids = [i.split(b"\r\n")[1].decode() for i in ids]
    logs = lambda: c.log("w1") + c.log("w2")  # noqa: E731
    wait_for("both forged jobs refused", lambda: all(i in logs() for i in ids), 60)
    assert f"refusing job {ids[0]} (run 'forged'): it is signed with another cluster key; not run" \
        in logs(), logs()
    assert f"refusing job {ids[1]} (run 'forged'): it is unsigned; not run" in logs(), logs()
    assert c.redis_cmd("XRANGE", "swarmkv:run:forged:results", "-", "+") == b"*0\r\n"

    # The document's manifest re-signed with another key: refused, published again.
    snap = "swarmkv:snap:" + first["snapshot"]["key"]
    manifest = json.loads(c.redis_cmd("GET", snap).split(b"\r\n", 1)[1].rsplit(b"\r\n", 1)[0])
    manifest.pop("sig")
    text = "swarmkv manifest\n" + json.dumps(manifest, separators=(",", ":"), sort_keys=True)
    manifest["sig"] = signed(other, text)
    c.redis_cmd("SET", snap, json.dumps(manifest, separators=(",", ":"), sort_keys=True))
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300",
                         "--cluster-key-file", files["key"])
    assert rc == 0, err
    assert f"the manifest of snapshot {first['snapshot']['key']} is refused: it is signed with " \
        "another cluster key; publishing the snapshot again" in err, err
    expect_equal_answers(json.loads(out), first)

    # No worker holds the run's key, or the run has none and every worker
    # one: refused at once, saying so (a run without a key used to count
    # the keyed workers as its own, enqueue where none of them reads, and
    # wait for its timeout).
    start = time.monotonic()
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--timeout", "120",
                         "--cluster-key-file", files["third"])
    assert rc != 0 and time.monotonic() - start < 60, (rc, err)
    third_id = signed("c" * 64, "swarmkv key id")[:16]
    assert "no live exact swarmkv worker holds model" in err and \
        f"and this run's cluster key (id {third_id})" in err and \
        "3 live worker(s) of this model hold another cluster key, or none" in err and \
        "--cluster-key-file <this run's key>" in err, err
    start = time.monotonic()
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--timeout", "120")
    assert rc != 0 and time.monotonic() - start < 60, (rc, err)
    assert "no live exact swarmkv worker holds model" in err and \
        "3 live worker(s) of this model hold a cluster key: give the run theirs with " \
        "--cluster-key-file" in err, err


@case
def needs_on_workers_equal_local(c):
    """Watermarks travel with the job: under --fork host and shared (exact, the
    default) an agent with `needs` answers from the cut document on a worker
    as it does locally and as --fork none does, token for token, with the
    same prompt_tokens (the doc-closing markup counts)."""
    c.use_pipeline("needs", "defaults: {max_tokens: 16, repeat_penalty: 1.1, dry_multiplier: 0.8}\n"
                "agents:\n"
                "  - {name: head, prompt: \"Who is the Licensor?\", needs: {tokens: 60}}\n"
                "  - {name: until, prompt: \"Who is the Licensor?\", needs: {until: \"Legal Entity\"}}\n"
                "  - {name: whole, prompt: \"Who is the Licensor?\"}\n")
    c.start_redis()
    c.start_worker("w1")
    reference = agents_by_name(c.local("none"))
    for fork in ("host", "shared"):
        rc, out, err = c.run("--redis", c.url(), "--fork", fork, "--json", "--timeout", "300")
        assert rc == 0, err
        remote_run = json.loads(out)
        assert remote_run["exact"] is True, remote_run
        remote = agents_by_name(remote_run)
        local = agents_by_name(c.local(fork))
        # Exact mode (the default): the worker's answers equal the local
        # run's and the re-prefill's, token for token.
        for other in (local, reference):
            expect_equal_answers({"agents": list(remote.values())}, {"agents": list(other.values())})
        for name in local:
            assert remote[name]["prompt_tokens"] == local[name]["prompt_tokens"], (
                name, remote[name]["prompt_tokens"], local[name]["prompt_tokens"])
    # The cut is real: a watermarked agent's branch opens with the markup that
    # closes the document, which the whole-document agent reads in its prefix.
    assert local["head"]["prompt_tokens"] > local["whole"]["prompt_tokens"], local
    stop_worker(c, "w1")


def shared_on_two_workers_equals_none(c):
    """The small pipeline with top_logprobs 2 run --fork shared on two
    workers: every agent ok, its answer equal to a local --fork none's token
    for token, and so are its logprobs (top_logprobs travels with the job,
    the logprobs with the result). The remote result."""
    c.use_small_pipeline()
    with open(c.pipeline) as f:
        spec = f.read()
    with open(c.pipeline, "w") as f:
        f.write(spec.replace("max_tokens: 24", "max_tokens: 24\n  top_logprobs: 2", 1))
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    rc, out, err = c.run("--redis", c.url(), "--fork", "shared", "--json", "--timeout", "300")
    assert rc == 0, err
    remote = json.loads(out)
    assert remote["fork"] == "shared"
    local = c.local("none")
    expect_equal_answers(remote, local)
    r, l = agents_by_name(remote), agents_by_name(local)
    for name in l:
        assert len(l[name]["logprobs"]) == len(l[name]["tokens"]), l[name]
        assert r[name]["logprobs"] == l[name]["logprobs"], f"agent {name}: logprobs differ"
    return remote


@case
def shared_on_workers_matches_the_reference(c):
    """--fork shared on the workers: exact by default, every answer and its
    logprobs equal --fork none's."""
    shared_on_two_workers_equals_none(c)


@case
def repacked_q4_0_on_workers_equals_local(c):
    """Q4_0 weights, made from the test model by the llama-quantize of the
    llama.cpp we build against ($SWARMKV_TEST_QUANTIZE): exact mode repacks
    them on every side (ggml's int8 gemm and gemv), and two workers' --fork
    shared answers and logprobs equal the local --fork none's."""
    q4 = os.path.join(c.tmp, "model.Q4_0.gguf")
    q = subprocess.run([os.environ["SWARMKV_TEST_QUANTIZE"], c.model, q4, "Q4_0"],
                       capture_output=True, timeout=120)
    assert q.returncode == 0, q.stderr.decode("utf-8", "replace")[-2000:]
    c.model = q4
    remote = shared_on_two_workers_equals_none(c)
    assert remote["model"].endswith("model.Q4_0.gguf"), remote["model"]
    stop_worker(c, "w1")


@case
def q8_0_kv_on_workers_equals_local(c):
    """kv_type q8_0 travels with the job: two workers answer as the local
    --fork none of the same K/V type does, token for token (exact holds over
    q8_0 K/V; a local shared run equals its none, ForkEquivalenceTest), and
    the snapshot that crossed the bus is about half the bytes of the f16 one
    (q8_0: 34 bytes per 32 values, f16: 64)."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    moved = {}
    for kv in ("q8_0", "f16"):
        rc, out, err = c.run("--redis", c.url(), "--fork", "shared", "--kv-type", kv, "--json", "--timeout", "300")
        assert rc == 0, err
        remote = json.loads(out)
        assert remote["engine"]["kv_type"] == kv, remote["engine"]
        assert remote["snapshot"]["source"] == "prefill", remote["snapshot"]
        moved[kv] = remote["transfer"]["bytes"]
        rc, out, err = c.run("--fork", "none", "--kv-type", kv, "--json", "--snapshot-cache", "off")
        assert rc == 0, err
        expect_equal_answers(remote, json.loads(out))
    # A worker prefilled each snapshot in its job's K/V type (and the others
    # restored it: the binding refuses a snapshot of another type).
    ratio = moved["q8_0"] / moved["f16"]
    assert 0.50 < ratio < 0.56, f"q8_0 snapshot {moved['q8_0']} bytes, f16 {moved['f16']}: ratio {ratio:.3f}"
    stop_worker(c, "w1")
    stop_worker(c, "w2")


def kill_a_worker_mid_run(c, *run_args):
    """Two workers (visibility timeout 3 s), a run --redis with `run_args`,
    and the first worker to claim a job SIGKILLed: the run must still exit
    0, the survivor having taken the stalled job over. Returns the run's
    JSON output and the survivor's name."""
    c.start_redis()
    opts = ("--visibility-timeout", "3", "--heartbeat", "0.5")
    c.start_worker("w1", *opts)
    c.start_worker("w2", *opts)
    t0 = time.monotonic()
    run = c.start_run("--redis", c.url(), "--json", "--timeout", "300", *run_args)
    wait_for("a worker to claim a job",
             lambda: "claimed job" in c.log("w1") or "claimed job" in c.log("w2"), 120)
    victim = "w1" if "claimed job" in c.log("w1") else "w2"
    survivor = "w2" if victim == "w1" else "w1"
    c.workers[victim].kill()
    rc, out, err = c.finish_run(run, 300)
    assert rc == 0, err
    assert "took over the stalled job" in c.log(survivor), c.log(survivor)
    print(f"completed {time.monotonic() - t0:.1f} s after the start, {victim} killed")
    return json.loads(out), survivor


@case
def killed_worker_job_is_taken_over(c):
    """SIGKILL a worker mid-job: the other takes its job over after the
    visibility timeout; every agent answered once, answers exact."""
    c.use_small_pipeline()
    result, survivor = kill_a_worker_mid_run(c, "--fork", "host", "--agents-per-job", "2")
    assert len(result["agents"]) == 4
    assert {a["worker"] for a in result["agents"]} == {survivor}, result["agents"]
    expect_equal_answers(result, c.local("host"))


@case
def sigterm_drains_the_job_in_hand(c):
    """SIGTERM while a job runs: the worker finishes and acknowledges it, exits 0."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1", threads=MAX_THREADS)
    run = c.start_run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    wait_for("the worker to claim the job", lambda: "claimed job" in c.log("w1"), 120)
    c.workers["w1"].send_signal(signal.SIGTERM)
    rc, out, err = c.finish_run(run, 300)
    assert rc == 0, err
    assert all(a["status"] == "ok" and a["worker"] == "w1" for a in json.loads(out)["agents"])
    assert c.workers["w1"].wait(60) == 0, c.log("w1")
    assert "job(s), 4 agent(s)" in c.log("w1"), c.log("w1")
    # Nothing pending: the job was acknowledged.
    pending = c.redis_cmd("XPENDING", c.redis_cmd_key("jobs"), "workers")
    assert pending.startswith(b"*4\r\n:0\r\n"), pending


@case
def hostile_jobs_fail_and_the_worker_goes_on(c):
    """1,000 hostile jobs, 50 of each of 20 kinds, interleaved: 'agents' not
    a list of names, fields missing, a run whose pipeline is not one, an
    agent the run lacks, snapshot manifests that lie (2^40 bytes in one
    chunk, a chunk failing its checksum, not JSON), prompts and reruns of
    the wrong shape. Each fails its job with its own reason and is
    acknowledged (the worker used to exit, and every restarted one claimed
    the job again and died); then the same worker runs the real pipeline
    and answers as a local run does."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1")
    stream = c.redis_cmd_key("jobs")
    spec = {"pipeline": {"document": {"text": "A short document."}, "fork": "host",
                         "agents": [{"name": "a", "prompt": "Say hi."}]},
            "document_source": "text", "guard": "serialized"}
    c.redis_cmd("SET", "swarmkv:run:hostile:spec", json.dumps(spec))
    c.redis_cmd("SET", "swarmkv:run:notjson:spec", "<html>")
    c.redis_cmd("SET", "swarmkv:run:typed:spec", json.dumps({"pipeline": 5}))
    huge, checksum, garbled = "f" * 32, "e" * 32, "d" * 32
    c.redis_cmd("SET", "swarmkv:snap:" + huge,
                json.dumps({"key": huge, "upload": "u", "bytes": 1 << 40, "chunk_bytes": 1 << 40,
                            "chunk_xxh3": [1]}))
    c.redis_cmd("SET", "swarmkv:snap:" + checksum,
                json.dumps({"key": checksum, "upload": "u", "bytes": 5, "chunk_bytes": 5,
                            "chunk_xxh3": [1]}))
    c.redis_cmd("SET", "swarmkv:snap:" + checksum + ":u:0", "abcde")
    c.redis_cmd("SET", "swarmkv:snap:" + garbled, "{not json")
    a = ("run", "hostile", "agents", '["a"]')
    nested = "[" * 100000
    not_names = "'agents' is not a JSON array of agent names (it is "
    kinds = [  # (the job's fields, what the worker says of it)
        (("run", "hostile", "agents", "not json"), not_names + "'not json')"),
        (("run", "hostile", "agents", '{"a":1}'), not_names + "'{\"a\":1}')"),
        (("run", "hostile", "agents", "[1,2]"), not_names + "'[1,2]')"),
        (("run", "hostile", "agents", "[]"), not_names + "'[]')"),
        (("run", "hostile", "agents", nested), not_names + "'" + nested[:200] + "')"),
        (("agents", '["a"]'), "has no 'run' field"),
        (("run", "hostile"), "has no 'agents' field"),
        (("run", "notjson", "agents", '["a"]'), "[json.exception.parse_error.101] parse error at "
         "line 1, column 1: syntax error while parsing value - invalid literal; last read: '<'"),
        (("run", "typed", "agents", '["a"]'),
         "failed: corruption: a pipeline message does not parse"),
        (("run", "hostile", "agents", '["zz"]'), "names agent 'zz', which run hostile does not have"),
        ((*a, "snapshot", huge), f"the manifest of snapshot {huge} is damaged"),
        ((*a, "snapshot", checksum), f"snapshot {checksum}: chunk 0 of 1 fails its checksum twice"),
        ((*a, "snapshot", garbled), f"the manifest of snapshot {garbled} is damaged"),
        ((*a, "prompts", "not json"),
         "'prompts' is not a JSON object of agent names to prompts (it is 'not json')"),
        ((*a, "prompts", '{"zz": "a prompt for no agent of the job"}'),
         "'prompts' has an entry for 'zz' that is not a prompt of one of its agents"),
        ((*a, "prompts", '{"a": 7}'), "'prompts' has an entry for 'a' that is not a prompt"),
        ((*a, "rerun", "[1]"), "'rerun' is not a JSON object of agent names to token arrays"),
        ((*a, "rerun", '{"zz": [1]}'), "'rerun' names 'zz', which is not one of its agents"),
        ((*a, "rerun", '{"a": ["x", -1]}'), "'rerun' of 'a' holds something other than token ids"),
        ((*a, "rerun", '{"a": 5}'), "'rerun' of 'a' is not a token array"),
    ]
    assert len(kinds) == 20
    each = 50
    for _ in range(each):
        for fields, _ in kinds:
            c.redis_cmd("XADD", stream, "*", *fields)
    wait_for("the worker to fail the 1,000 hostile jobs",
             lambda: c.log("w1").count(" failed: ") >= each * len(kinds) or
             c.workers["w1"].poll() is not None, 300)
    assert c.workers["w1"].poll() is None, c.log("w1")[-3000:]
    log = c.log("w1")
    assert log.count(" failed: ") == each * len(kinds), log.count(" failed: ")
    for fields, said in kinds:
        assert log.count(said) == each, (fields[:6], said, log.count(said))
    results = c.redis_cmd("XRANGE", "swarmkv:run:hostile:results", "-", "+", "COUNT", "40")
    assert b"chunk size or chunk count is inconsistent (1099511627776 bytes in 1 chunks of " \
        b"1099511627776)" in results, results[:2000]
    pending = c.redis_cmd("XPENDING", stream, "workers")
    assert pending.startswith(b"*4\r\n:0\r\n"), pending
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    remote = json.loads(out)
    assert all(a["status"] == "ok" and a["worker"] == "w1" for a in remote["agents"])
    expect_equal_answers(remote, c.local("host"))


@case
def a_job_no_worker_finishes_goes_to_the_dead_letters(c):
    """A job delivered more than 3 times (each worker that took it died in
    it) is not run again: the worker that claims it next moves it to the
    dead-letter stream with the reason, fails its agents with that reason,
    acknowledges it and goes on; a job delivered 3 times runs as usual."""
    c.start_redis()
    stream = c.redis_cmd_key("jobs")
    c.redis_cmd("XGROUP", "CREATE", stream, "workers", "0", "MKSTREAM")
    for run in ("poison", "third"):
        spec = {"pipeline": {"document": {"text": "A short document."}, "fork": "none",
                             "agents": [{"name": "a", "prompt": "Say hi.", "max_tokens": 4},
                                        {"name": "b", "prompt": "Say bye.", "max_tokens": 4}]},
                "document_source": "text", "guard": "serialized"}
        c.redis_cmd("SET", f"swarmkv:run:{run}:spec", json.dumps(spec))
    ids = {}
    for run, deliveries in (("poison", 3), ("third", 2)):
        ids[run] = c.redis_cmd("XADD", stream, "*", "run", run, "agents", '["a","b"]').split(b"\r\n")[1]
        # Delivered to a worker that died in it: read, then the count and an
        # idle time past any visibility timeout set as a crash would leave them.
        c.redis_cmd("XREADGROUP", "GROUP", "workers", "ghost", "COUNT", "1", "STREAMS", stream, ">")
        c.redis_cmd("XCLAIM", stream, "workers", "ghost", "0", ids[run], "IDLE", "3600000", "RETRYCOUNT",
                    str(deliveries))
    c.start_worker("w1")
    wait_for("the worker to take both jobs",
             lambda: c.log("w1").count("done: 2 result(s)") == 2 or c.workers["w1"].poll() is not None, 120)
    assert c.workers["w1"].poll() is None, c.log("w1")
    dead = c.redis_cmd("XRANGE", c.redis_cmd_key("dead"), "-", "+")
    assert ids["poison"] in dead and ids["third"] not in dead, dead
    for part in (b"deliveries\r\n$1\r\n4", b"job.run\r\n$6\r\npoison", b"worker\r\n$2\r\nw1",
                 b"was delivered 4 times and no worker finished it"):
        assert part in dead, (part, dead)
    poisoned = c.redis_cmd("XRANGE", "swarmkv:run:poison:results", "-", "+")
    assert poisoned.count(b'"code":"aborted"') == 2, poisoned
    assert b"was delivered 4 times and no worker finished it" in poisoned, poisoned
    third = c.redis_cmd("XRANGE", "swarmkv:run:third:results", "-", "+")
    assert third.count(b'"status":"ok"') == 2, third
    pending = c.redis_cmd("XPENDING", stream, "workers")
    assert pending.startswith(b"*4\r\n:0\r\n"), pending


@case
def a_damaged_store_entry_is_removed_and_made_again(c):
    """A snapshot in a worker's store with its cells moved one position on,
    or with only its first and last cell left, and its checksums resealed
    passes every file check; the check of its cells before the restore
    fails the agents, the worker removes the entry, the coordinator has the
    snapshot made and published again and retries the agents once: the run
    answers as the local run does. (The worker used to keep the entry, and
    every later run failed on it; the two-cell one restored "ok" and
    answered from a document with holes.)"""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1")
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    store = os.path.join(c.tmp, "store-w1")
    entries = [f for f in os.listdir(store) if f.endswith(".swkv")]
    assert len(entries) == 1, entries
    entry = os.path.join(store, entries[0])
    local = c.local("host")
    refusals = {"move": "its KV cell 0 holds position 1 of sequences [0], where a prefill puts "
                        "position 0 of sequence 0 alone",
                "two-cells": "its state holds 2 KV cells, where its "}
    for n, (mode, refusal) in enumerate(refusals.items(), 1):
        p = subprocess.run([os.environ["SWARMKV_TEST_FORGE_CELLS"], entry, mode],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
        assert rc == 0, err
        expect_equal_answers(json.loads(out), local)
        log = c.log("w1")
        assert f"removed snapshot {entry} from its store: snapshot '{entry}': {refusal}" in log, log
        assert log.count("removed snapshot") == n, log
        assert "publishing the snapshot again" in err, err
        assert os.path.exists(entry), "the snapshot made again is in the store"
    # The entry made again is sound: a third run restores it and answers alike.
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    expect_equal_answers(json.loads(out), local)
    assert c.log("w1").count("removed snapshot") == 2


@case
def a_bad_result_entry_fails_its_agent_not_the_run(c):
    """A result entry with a 'fetch_ms' that is not a number and a 'result'
    that is not an agent's: that agent fails naming the entry's worker, the
    others answer (the coordinator aborted the whole run: internal: stod).
    A fake heartbeat lets the run start before any worker, so the entry is
    in the stream before a real result can be."""
    c.use_small_pipeline()
    c.start_redis()
    c.redis_cmd("SET", c.redis_cmd_key("worker") + ":fake", "1", "EX", "60")
    run = c.start_run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")

    def run_id():
        m = re.search(rb"swarmkv:run:(\w+):spec", c.redis_cmd("KEYS", "swarmkv:run:*:spec"))
        return m.group(1).decode() if m else None
    wait_for("the run's spec in Redis", lambda: run_id() is not None, 60)
    c.redis_cmd("XADD", f"swarmkv:run:{run_id()}:results", "*", "agent", "patents", "worker",
                "rogue", "job", "x", "fetch_bytes", "1", "fetch_ms", "y", "snapshot_unavailable",
                "0", "result", "{}")
    c.start_worker("w1")
    rc, out, err = c.finish_run(run, 300)
    assert "internal" not in err, err
    assert "has fetch_ms 'y', not a number >= 0; counted as 0" in err, err
    by = agents_by_name(json.loads(out))
    assert by["patents"]["status"] == "failed" and by["patents"]["worker"] == "rogue", by
    assert "the result from worker 'rogue' does not parse" in by["patents"]["error"]["message"]
    assert all(by[a]["status"] == "ok" for a in ("summary", "obligations", "risks")), by
    assert rc == 1, (rc, err)


@case
def redis_down_at_start_fails_fast(c):
    """No server: the coordinator and a worker fail within 5 s naming the address."""
    for args in (["run", c.pipeline, "--redis", c.url()], ["worker", "--redis", c.url()]):
        t0 = time.monotonic()
        p = subprocess.run([c.cli, *args], env=c.env(), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30)
        took = time.monotonic() - t0
        err = p.stderr.decode()
        assert p.returncode == 1, (p.returncode, err)
        assert f"swarmkv: error: io: {c.url()}: cannot connect: Connection refused" in err, err
        assert took < 5, f"{args[0]} took {took:.1f} s"


@case
def fork_from_on_workers_equal_local(c):
    """fork_from two deep (a <- b <- c) and a sibling (d <- a): a child's job
    runs its ancestors again on its worker (their conversation is there
    then) and the worker checks their answers against the run's; every
    answer equals a local run's, token for token, under both forks."""
    c.use_pipeline("tree", "defaults: {max_tokens: 20}\nagents:\n"
                "  - {name: a, prompt: \"What is this text about?\"}\n"
                "  - {name: b, fork_from: a, prompt: \"Say more about that.\"}\n"
                "  - {name: c, fork_from: b, prompt: \"Now in one sentence.\"}\n"
                "  - {name: d, fork_from: a, prompt: \"Who wrote it?\"}\n")
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    for fork in ("shared", "host"):
        rc, out, err = c.run("--redis", c.url(), "--fork", fork, "--json", "--timeout", "300")
        assert rc == 0, err
        expect_equal_answers(json.loads(out), c.local(fork))
    logs = c.log("w1") + c.log("w2")
    assert "(a, b, c)" in logs, logs  # c's job: its ancestors, then c
    # A parent that answers otherwise when run again (as it may without
    # exact mode): its child fails saying so, and the parent's re-run is
    # not posted as a second answer.
    spec = {"pipeline": {"document": {"text": "A short document."}, "fork": "none",
                         "agents": [{"name": "a", "prompt": "Say hi.", "max_tokens": 4},
                                    {"name": "b", "prompt": "Again.", "fork_from": "a",
                                     "max_tokens": 4}]},
            "document_source": "text", "guard": "serialized"}
    c.redis_cmd("SET", "swarmkv:run:rerun:spec", json.dumps(spec))
    c.redis_cmd("XADD", c.redis_cmd_key("jobs"), "*", "run", "rerun", "agents", '["a","b"]',
                "snapshot", "", "rerun", '{"a": [1, 2, 3]}')
    wait_for("the job's result", lambda: b"agent" in c.redis_cmd(
        "XRANGE", "swarmkv:run:rerun:results", "-", "+"), 60)
    results = c.redis_cmd("XRANGE", "swarmkv:run:rerun:results", "-", "+")
    assert results.count(b"\r\nagent\r\n") == 1, results
    assert b"agent 'b' continues the conversation of 'a', which its worker ran again and which " \
        b"answered otherwise when run again (from token 0 on)" in results, results


@case
def placeholders_on_workers_equal_local(c):
    """Agents that use other agents' answers ({{name}}, and a field of a
    structured one, {{f.licence}}, and of a tool call, {{t.arguments.zeta}}):
    the coordinator renders their prompts and the workers run them, a schema
    or tool agent under its grammar; every answer
    equals a local run's, token for token, under both fork strategies."""
    c.use_pipeline("chain", "defaults: {max_tokens: 24}\nagents:\n"
                "  - {name: a, prompt: \"What is this text about?\"}\n"
                "  - {name: b, prompt: \"Who is the Licensor?\"}\n"
                "  - {name: c, depends_on: [a], prompt: \"An analyst said: {{a}} Is that right?\"}\n"
                "  - {name: d, depends_on: [a, b], prompt: \"{{a}} / {{b}} Combine both.\"}\n"
                "  - {name: e, depends_on: [c], prompt: \"Check this: {{c}}\"}\n"
                "  - {name: f, prompt: \"Is this a licence?\", json_schema: {type: object, "
                "properties: {licence: {type: boolean}}, required: [licence]}}\n"
                "  - {name: g, depends_on: [f], prompt: \"Someone answered {{f.licence}}. Why?\"}\n"
                "  - {name: t, prompt: \"Who grants it?\", max_tokens: 48, tools: [{name: party, "
                "parameters: {type: object, properties: {zeta: {type: string, maxLength: 16}, "
                "alpha: {type: boolean}}, required: [zeta, alpha]}}]}\n"
                "  - {name: u, depends_on: [t], prompt: \"Is {{t.arguments.zeta}} a person?\"}\n")
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    for fork in ("shared", "host"):
        rc, out, err = c.run("--redis", c.url(), "--fork", fork, "--json", "--timeout", "300")
        assert rc == 0, err
        remote = json.loads(out)
        expect_equal_answers(remote, c.local(fork))
        by = agents_by_name(remote)
        assert by["c"]["prompt_rendered"] == "An analyst said: " + by["a"]["answer"] + " Is that right?"
        assert by["e"]["prompt_rendered"] == "Check this: " + by["c"]["answer"]
        assert isinstance(by["f"]["answer_json"]["licence"], bool), by["f"]
        assert by["g"]["prompt_rendered"] == \
            f"Someone answered {json.dumps(by['f']['answer_json']['licence'])}. Why?", by["g"]
        # A tool agent's call, its arguments in their schema's order.
        assert by["t"]["answer_json"]["name"] == "party", by["t"]
        assert list(json.loads(by["t"]["answer"])["arguments"]) == ["zeta", "alpha"], by["t"]
        assert by["u"]["prompt_rendered"] == \
            f"Is {by['t']['answer_json']['arguments']['zeta']} a person?", by["u"]
        assert all(a["worker"] in ("w1", "w2") for a in remote["agents"]), out


def use_corpus(c):
    """Four 700-character documents (two licences, two parts each), two
    agents per document and a reduce agent over the first one's answers."""
    folder = os.path.join(c.tmp, "docs")
    os.makedirs(folder)
    for name in ("apache-2.0.txt", "mpl-2.0.txt"):
        with open(os.path.join(c.source, "examples", "documents", name)) as f:
            text = f.read()
        for part in range(2):
            with open(os.path.join(folder, f"{part}-{name}"), "w") as f:
                f.write(text[part * 700:(part + 1) * 700])
    c.pipeline = os.path.join(c.tmp, "corpus.yaml")
    with open(c.pipeline, "w") as f:
        f.write(f"documents: [{folder}]\ndefaults: {{max_tokens: 12}}\nagents:\n"
                "  - {name: a, prompt: \"What is this text about?\"}\n"
                "  - {name: b, prompt: \"Who gives the licence?\"}\n"
                "  - {name: all, scope: corpus, max_tokens: 8, prompt: \"{{a[*]}} Which is longest?\"}\n")


def expect_corpus_equal(remote, local):
    """Every document's answers and the reduce agent's equal the local run's."""
    assert remote["ok"] and remote["documents_run"] == len(local["documents"]), remote
    for r, l in zip(remote["documents"], local["documents"]):
        assert r["name"] == l["name"], (r["name"], l["name"])
        expect_equal_answers(r["result"], l["result"])
    assert remote["reduce"]["agents"][0]["tokens"] == local["reduce"]["agents"][0]["tokens"]


@case
def corpus_documents_spread_over_two_workers_equal_local(c):
    """A corpus under run --redis: documents run at once, one per live worker
    (each document's agents one job, so one worker prefills and answers it),
    reduce agents on the coordinator; every answer, the reduce agent's too,
    equals a local run's, token for token."""
    use_corpus(c)
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    rc, out, err = c.run("--redis", c.url(), "--json", "--timeout", "300")
    assert rc == 0, err
    assert err.count("coordinator: no cluster key") == 1, f"warned once, not per document: {err}"
    remote = json.loads(out)
    expect_corpus_equal(remote, c.local("shared"))
    workers = set()
    for r in remote["documents"]:
        ran_on = {a["worker"] for a in r["result"]["agents"]}
        assert len(ran_on) == 1, f"{r['name']}: one job per document, got {ran_on}"
        workers |= ran_on
    assert workers == {"w1", "w2"}, f"both workers get documents: {workers}"
    assert remote["reduce"]["agents"][0]["worker"] is None, "the reduce agent runs on the coordinator"


@case
def corpus_survives_a_killed_worker(c):
    """SIGKILL a worker while it holds a document: the other worker takes
    that document's job over after the visibility timeout, so no document
    is lost, and every answer, the reduce agent's too, equals a local
    run's."""
    use_corpus(c)
    remote, _ = kill_a_worker_mid_run(c)
    expect_corpus_equal(remote, c.local("shared"))


@case
def no_live_worker_fails_fast(c):
    """No worker at all, then only a --no-exact one for an exact run: jobs go
    to workers loaded with the run's kernels, so the run fails fast naming
    which worker it needs, and the --no-exact run takes that worker."""
    c.start_redis()
    t0 = time.monotonic()
    rc, out, err = c.run("--redis", c.url(), timeout=30)
    assert time.monotonic() - t0 < 5
    assert rc == 2, (rc, err)
    model_file = os.path.basename(c.model)
    assert (f"swarmkv: error: not_found: no live exact swarmkv worker holds model {model_file} "
            f"(sha256 " in err and f") at {c.url()}; start one with: swarmkv worker --redis URL "
            f"--model {model_file}\n" in err), err
    c.start_worker("stock", "--no-exact")
    assert "--no-exact runs" in c.log("stock"), c.log("stock")
    rc, out, err = c.run("--redis", c.url(), timeout=30)
    assert rc == 2, (rc, err)
    assert "no live exact swarmkv worker holds model" in err, err
    stop_worker(c, "stock")


@case
def a_replayed_heartbeat_keeps_no_run_waiting(c):
    """A keyed worker's heartbeat, copied while it lived and written back
    after it stopped (a replay: the signature still holds), does not make a
    keyed run wait its whole --timeout for a dead worker: the beat carries
    the Redis time it was written at, inside its signature, and a stale one
    is refused by name."""
    c.use_small_pipeline()
    c.start_redis()
    key_file = os.path.join(c.tmp, "key")
    with open(key_file, "w") as f:
        f.write("a" * 64 + "\n")
    c.start_worker("w1", "--cluster-key-file", key_file)
    key_id = signed("a" * 64, "swarmkv key id")[:16]
    beat_key = f"swarmkv:worker:{model_sha256(c.model)}:k{key_id}:exact:w1"
    beat = c.redis_cmd("GET", beat_key).split(b"\r\n", 1)[1].rsplit(b"\r\n", 1)[0]
    assert json.loads(beat)["sig"], beat
    stop_worker(c, "w1")
    time.sleep(5.5)  # the copied beat outlives its 5 heartbeats of life
    c.redis_cmd("SET", beat_key, beat, "PX", 600000)
    start = time.monotonic()
    rc, out, err = c.run("--redis", c.url(), "--timeout", "120", "--cluster-key-file", key_file,
                         timeout=150)
    assert rc == 1 and time.monotonic() - start < 30, (rc, time.monotonic() - start, err)
    assert "error: unauthenticated: no live exact swarmkv worker holds model" in err, err
    assert "worker 'w1' is refused: its heartbeat is" in err and "(a replay?)" in err, err


@case
def jobs_go_to_workers_of_their_kernels(c):
    """An exact worker and a --no-exact one on one model: each run's jobs go
    to the worker loaded with its kernels only."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("stock", "--no-exact")
    c.start_worker("exact")
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--no-exact", "--json", "--timeout",
                         "300")
    assert rc == 0, err
    result = json.loads(out)
    assert result["exact"] is False and {a["worker"] for a in result["agents"]} == {"stock"}, out
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    result = json.loads(out)
    assert result["exact"] is True and {a["worker"] for a in result["agents"]} == {"exact"}, out
    # The only exact worker dies mid-run: the live --no-exact one does not
    # count, so the run fails once no exact worker was seen for the grace
    # time instead of waiting out its --timeout.
    claimed = c.log("exact").count("claimed job")
    t0 = time.monotonic()
    run = c.start_run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    wait_for("the exact worker to claim a job",
             lambda: c.log("exact").count("claimed job") > claimed, 120)
    c.workers["exact"].kill()
    c.workers["exact"].wait(10)
    rc, _, err = c.finish_run(run, 120)
    assert rc != 0 and "no live exact swarmkv worker holds model" in err, (rc, err)
    assert time.monotonic() - t0 < 90, f"failed only after {time.monotonic() - t0:.0f} s"
    stop_worker(c, "stock")


@case
def wrong_password_is_refused(c):
    c.use_small_pipeline()
    c.start_redis("--requirepass", "right")
    for userinfo, text in ((":wrong", "AUTH refused: WRONGPASS invalid username-password pair"),
                           ("", "the server requires a password: give it in the URL")):
        for args in (["run", c.pipeline, "--redis", c.url(userinfo)],
                     ["worker", "--redis", c.url(userinfo)]):
            p = subprocess.run([c.cli, *args], env=c.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=30)
            err = p.stderr.decode()
            assert p.returncode == 2, (args, p.returncode, err)
            assert f"swarmkv: error: invalid_argument: {c.url()}: {text}" in err, err
            assert "wrong" not in err.replace("WRONGPASS", ""), "the password is never printed"
    # The right password works end to end, from $SWARMKV_REDIS too.
    log = open(os.path.join(c.tmp, "w1.log"), "w")
    env = c.env()
    env["SWARMKV_REDIS"] = c.url(":right")
    w = subprocess.Popen([c.cli, "worker", "--name", "w1", "-t", str(MAX_THREADS)], env=env, stdout=log,
                         stderr=subprocess.STDOUT)
    c.children.append(w)
    c.workers["w1"] = w
    wait_for("the worker", lambda: "serving model" in c.log("w1"), 60)
    p = subprocess.run([c.cli, "run", c.pipeline, "--fork", "host", "--json", "--redis"], env=env,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    assert p.returncode == 0, p.stderr.decode()
    # Without --redis the variable alone does not make a coordinator.
    p = subprocess.run([c.cli, "run", c.pipeline, "--fork", "host", "--json", "--snapshot-cache",
                        "off"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=300)
    assert p.returncode == 0 and json.loads(p.stdout)["transfer"] is None, p.stderr.decode()


@case
def corrupted_chunk_is_detected_and_republished(c):
    """A damaged chunk in Redis: the fetching worker's checksum catches it,
    the coordinator publishes the snapshot again, the run completes exact."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1")
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    key = json.loads(out)["snapshot"]["key"]
    stop_worker(c, "w1")
    manifest = json.loads(c.redis_cmd("GET", f"swarmkv:snap:{key}").split(b"\r\n", 1)[1]
                          .rsplit(b"\r\n", 1)[0])
    assert c.redis_cmd("SETRANGE", f"swarmkv:snap:{key}:{manifest['upload']}:0", "100",
                       "DAMAGED").startswith(b":")
    c.start_worker("w2")  # a fresh store: it must fetch
    rc, out, err = c.run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "300")
    assert rc == 0, err
    expect_equal_answers(json.loads(out), c.local("host"))
    log = c.log("w2")
    assert f"snapshot {key}: chunk 0 of {len(manifest['chunk_xxh3'])} fails its checksum twice" in log, log
    assert "publishing the snapshot again" in err, err


@case
def redis_restart_mid_run_completes(c):
    """Redis killed and restarted empty while the workers run: the coordinator
    puts the run back and completes, or fails clearly before its timeout."""
    c.use_small_pipeline()
    c.start_redis()
    c.start_worker("w1")
    c.start_worker("w2")
    t0 = time.monotonic()
    run = c.start_run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "120")
    wait_for("a worker to claim a job",
             lambda: "claimed job" in c.log("w1") or "claimed job" in c.log("w2"), 120)
    c.kill_redis()
    time.sleep(0.5)
    c.start_redis()
    rc, out, err = c.finish_run(run, 150)
    took = time.monotonic() - t0
    assert took < 130, f"the run took {took:.0f} s, past its 120 s timeout"
    assert rc == 0, err
    assert "lost this run's state" in err, err
    expect_equal_answers(json.loads(out), c.local("host"))
    for w in ("w1", "w2"):
        assert c.workers[w].poll() is None, f"{w} died in the restart: {c.log(w)}"


@case
def redis_away_for_12_s_mid_run_completes(c):
    """Redis stopped for 12 s mid-run, then started again with its data (an
    append-only file): longer than a client's reconnect default (6 s), its
    command timeout (10 s) and a worker key's life (5 heartbeats), yet
    nobody exits, every side reconnects and goes on, and the run completes
    with a local run's answers."""
    c.use_small_pipeline()
    data = os.path.join(c.tmp, "redis-data")
    os.makedirs(data)
    c.start_redis("--appendonly", "yes", "--appendfsync", "always", "--dir", data)
    c.start_worker("w1")
    c.start_worker("w2")
    run = c.start_run("--redis", c.url(), "--fork", "host", "--json", "--timeout", "120")
    wait_for("a worker to claim a job",
             lambda: "claimed job" in c.log("w1") or "claimed job" in c.log("w2"), 120)
    c.redis.terminate()  # a clean shutdown: the append-only file is complete
    c.redis.wait(10)
    time.sleep(12)
    for w in ("w1", "w2"):
        assert c.workers[w].poll() is None, f"{w} exited while Redis was away: {c.log(w)}"
    assert run.poll() is None, "the coordinator exited while Redis was away"
    c.start_redis()
    rc, out, err = c.finish_run(run, 150)
    assert rc == 0, err
    assert "lost this run's state" not in err, err
    assert "connection re-established" in err, err
    expect_equal_answers(json.loads(out), c.local("host"))
    for w in ("w1", "w2"):
        assert c.workers[w].poll() is None, f"{w} exited after Redis came back: {c.log(w)}"
    assert any("reconnecting until it is back" in c.log(w) for w in ("w1", "w2")), c.log("w1")


@case
def priority_orders_the_jobs(c):
    """One worker, one agent per job: the agents start in priority order
    (highest first), not in pipeline order."""
    c.use_small_pipeline()
    with open(c.pipeline) as f:
        spec = f.read()
    for name, prio in (("summary", 0), ("obligations", 5), ("risks", 1), ("patents", 9)):
        spec = spec.replace(f"  - name: {name}\n", f"  - name: {name}\n    priority: {prio}\n", 1)
    assert spec.count("priority:") == 4, spec
    with open(c.pipeline, "w") as f:
        f.write(spec.replace("max_tokens: 24", "max_tokens: 8"))
    c.start_redis()
    c.start_worker("w1")
    rc, out, err = c.run("--redis", c.url(), "--json", "--agents-per-job", "1", "--timeout", "300")
    assert rc == 0, err
    agents = json.loads(out)["agents"]
    assert all(a["status"] == "ok" for a in agents), out
    claimed = re.findall(r"claimed job \S+ of run \S+: 1 agent\(s\) \((\w+)\)", c.log("w1"))
    assert claimed == ["patents", "obligations", "risks", "summary"], claimed
    # The workers' times are on the run's clock: each agent starts after the
    # one before it ended, in that order.
    by_start = sorted(agents, key=lambda a: a["started_at_ms"])
    assert [a["name"] for a in by_start] == claimed, [(a["name"], a["started_at_ms"]) for a in agents]
    for before, after in zip(by_start, by_start[1:]):
        assert before["done_at_ms"] <= after["started_at_ms"] + 50, (before, after)
        assert after["started_at_ms"] <= after["first_token_at_ms"] <= after["done_at_ms"], after


def main():
    name, cli, source, model, redis_server = sys.argv[1:6]
    with tempfile.TemporaryDirectory(prefix="swarmkv-cluster-") as tmp:
        c = Cluster(cli, source, model, redis_server, tmp)
        # The keys of exact runs (the default) on this model: keys::pool.
        c.redis_cmd_key = lambda kind: "swarmkv:" + kind + ":" + model_sha256(model) + ":exact"
        try:
            CASES[name](c)
        except BaseException:
            for w in c.workers:
                sys.stderr.write(f"--- {w}.log\n{c.log(w)}\n")
            raise
        finally:
            c.stop_all()
    print(f"{name}: ok")


def model_sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


if __name__ == "__main__":
    main()
