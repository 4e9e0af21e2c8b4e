#!/usr/bin/env python3
"""A corpus end to end: 20 documents x 4 agents, SwarmKV against re-prefills and llama-server.

The corpus: 20 licence texts cut to their first --chars characters (the 14
of Debian's /usr/share/common-licenses, examples/corpus's MIT, ISC and zlib,
and the second --chars characters of the three longest: 20 distinct texts).
Four greedy agents of --n-predict tokens each, the same prompts everywhere.

Arms, each one whole command, wall clock from its start to its exit (model
load included), alternated per trial (swarmbench.trials.alternate):

  shared     swarmkv run --document DIR (fork shared, the default), store off
  none       the same with --fork none: every agent re-prefills its document
  warm       the same as shared with the snapshot store on, its second run
             (the first, cold, fills a fresh store each trial; not timed)
  llama-server  llama-server -np 4 from the same llama.cpp build, its prompt
             cache on (cache_prompt), started once per trial (its start
             timed apart); per document the four agents' chat requests at
             once, documents one after another
  cluster-1, cluster-2  run --redis over 1 or 2 `swarmkv worker`s of one
             thread each (a fresh redis-server and worker stores per trial,
             the workers started and their model loaded before the clock);
             one document per worker at a time

--arms picks arms (default all); rows of other arms already in
OUT/results.json are kept, so a section can be measured again alone.

Every trial checks that shared's and warm's answers equal none's (exact
mode). llama-server runs llama.cpp's stock kernels: its answers are not
compared. Writes OUT/results.json, OUT/results.csv, OUT/report.md,
OUT/corpus.png and OUT/command.sh.

usage: python3 bench/corpus.py [--out bench/results/corpus] [--build build/release]
           [--model PATH] [--trials 3] [--chars 2000] [--n-predict 32] [--threads 2]
"""
import argparse
import concurrent.futures
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report, style, trials  # noqa: E402
from swarmbench.ports import free_port  # noqa: E402
from swarmbench import servers  # noqa: E402
from swarmbench.servers import Process, http_ready  # noqa: E402

SYSTEM = "You are a careful licence analyst. Answer from the document only, concisely."
AGENTS = [("licence", "Which licence is this? Give its name and version only."),
          ("duties", "What must someone who redistributes this work do? One sentence."),
          ("patents", "Does the text grant patent rights? Answer yes or no, then one short reason."),
          ("warranty", "Does the text disclaim all warranty? Answer yes or no, then one short reason.")]
ARMS = ["shared", "none", "warm", "llama-server", "cluster-1", "cluster-2"]


def make_corpus(folder, chars):
    """The 20 documents in folder; returns their names."""
    common = "/usr/share/common-licenses"
    texts = {}
    for name in sorted(os.listdir(common)):
        path = os.path.join(common, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        texts[name.lower()] = open(path, encoding="utf-8", errors="replace").read()
    for name in ("mit", "isc", "zlib"):
        texts[name] = open(os.path.join(REPO, "examples", "corpus", name + ".txt")).read()
    docs = {f"{k}.txt": v[:chars] for k, v in texts.items()}
    for k in sorted(texts, key=lambda k: -len(texts[k]))[:3]:
        docs[f"{k}-part2.txt"] = texts[k][chars:2 * chars]
    assert len(docs) == 20, sorted(docs)
    os.makedirs(folder, exist_ok=True)
    for name, text in docs.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    return sorted(docs)


def pipeline_file(path, n_predict):
    agents = [{"name": n, "prompt": p} for n, p in AGENTS]
    spec = {"name": "corpus-bench", "system": SYSTEM, "document": {"text": "replaced by --document"},
            "defaults": {"max_tokens": n_predict, "temperature": 0}, "agents": agents}
    with open(path, "w") as f:
        json.dump(spec, f)


def swarmkv_run(a, tmp, fork, cache_dir=None, redis_url=None):
    cmd = [os.path.join(a.build, "swarmkv"), "run", os.path.join(tmp, "p.json"), "--document",
           os.path.join(tmp, "docs"), "--model", a.model, "-t", str(a.threads), "--json", "--fork", fork]
    if redis_url:
        cmd += ["--redis", redis_url, "--timeout", "3600"]
    cmd += ["--snapshot-cache", "on", "--cache-dir", cache_dir] if cache_dir else ["--snapshot-cache", "off"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"corpus.py: {trials.shown(cmd)} failed: {p.stderr[-2000:]}")
    out = json.loads(p.stdout)
    answers = {(d["name"], ag["name"]): ag["answer"] for d in out["documents"] for ag in d["result"]["agents"]}
    prefilled = sum(d["result"]["snapshot"]["prefilled_tokens"] if d["result"]["snapshot"] else
                    d["result"]["prefix_tokens"] * d["result"]["document_prefills"] for d in out["documents"])
    return wall, answers, {"prefilled_tokens": prefilled, "total_ms": out["total_ms"], "load_ms": out["load_ms"]}


def cluster_run(a, tmp, workers, trial):
    """run --redis over `workers` fresh workers of one thread each: (wall s, answers, extra)."""
    root = os.path.join(tmp, f"cluster-{workers}-{trial}")
    os.makedirs(root)
    with servers.redis(log_path=os.path.join(root, "redis.log")) as redis:
        url = f"redis://127.0.0.1:{redis.port}"
        env = dict(os.environ, SWARMKV_CACHE=os.path.join(root, "cache"))
        started = []
        try:
            for w in range(workers):
                log = os.path.join(root, f"w{w}.log")
                p = Process([os.path.join(a.build, "swarmkv"), "worker", "--redis", url, "--name", f"w{w}",
                             "--model", a.model, "-t", "1", "--cache-dir", os.path.join(root, f"store-{w}")],
                            log, env=env)
                started.append(p)
                p.wait_ready(lambda: "serving model" in p.log_text(), timeout=120)
            wall, answers, extra = swarmkv_run(a, tmp, "shared", redis_url=url)
        finally:
            for p in started:
                p.stop()
    return wall, answers, extra


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def llama_server_run(a, tmp, names):
    port = free_port()
    n_ctx = 4 * 2048
    cmd = [a.llama_server, "-m", a.model, "--port", str(port), "--host", "127.0.0.1", "-np", "4", "-c", str(n_ctx),
           "-t", str(a.threads), "--no-webui"]
    t0 = time.perf_counter()
    with Process(cmd, log_path=os.path.join(tmp, "llama-server.log")) as server:
        start = server.wait_ready(http_ready(port), timeout=300)
        t1 = time.perf_counter()
        answers = {}
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for name in names:
                doc = open(os.path.join(tmp, "docs", name)).read()
                bodies = [{"messages": [{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": doc + "\n\n" + prompt}],
                           "max_tokens": a.n_predict, "temperature": 0, "cache_prompt": True}
                          for _, prompt in AGENTS]
                for (agent, _), reply in zip(AGENTS, pool.map(lambda b: post(port, b), bodies)):
                    answers[(name, agent)] = reply["choices"][0]["message"]["content"]
        requests_s = time.perf_counter() - t1
    del t0
    return start + requests_s, answers, {"start_s": start, "requests_s": requests_s}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join("bench", "results", "corpus"))
    ap.add_argument("--build", default=os.path.join("build", "release"))
    ap.add_argument("--model", default=os.environ.get("SWARMKV_TEST_MODEL", ""))
    ap.add_argument("--llama-server", default=os.environ.get("SWARMKV_LLAMA_SERVER", ""))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--chars", type=int, default=2000)
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arms", default=",".join(ARMS))
    a = ap.parse_args()
    arms = a.arms.split(",")
    if set(arms) - set(ARMS):
        sys.exit(f"corpus.py: unknown arms {sorted(set(arms) - set(ARMS))}; known: {ARMS}")
    if not a.model:
        sys.exit("corpus.py: --model or $SWARMKV_TEST_MODEL names the GGUF model")
    if not a.llama_server:
        found = subprocess.run(["find", os.path.expanduser("~/.cache/swarmkv/llama.cpp"), "-path", "*install/bin/llama-server"],
                               capture_output=True, text=True).stdout.split()
        if not found:
            sys.exit("corpus.py: no llama-server; give --llama-server")
        a.llama_server = found[0]
    os.makedirs(a.out, exist_ok=True)
    report.write_command(a.out)
    tmp = tempfile.mkdtemp(prefix="swarmkv-corpus-bench-")
    results_path = os.path.join(a.out, "results.json")
    kept = []
    if os.path.exists(results_path):
        with open(results_path) as f:
            kept = [r for r in json.load(f).get("rows", []) if r["arm"] not in arms]
    rows = []
    try:
        names = make_corpus(os.path.join(tmp, "docs"), a.chars)
        pipeline_file(os.path.join(tmp, "p.json"), a.n_predict)
        untimed_reference = None
        if "none" not in arms:
            trials.log("the reference: fork none, not timed")
            untimed_reference = swarmkv_run(a, tmp, "none")[1]
        for trial in range(a.trials):
            measured = {}
            for arm in trials.alternate(arms, trial):
                trials.log(f"trial {trial + 1}/{a.trials}: {arm}")
                if arm.startswith("cluster-"):
                    wall, answers, extra = cluster_run(a, tmp, int(arm.split("-")[1]), trial)
                elif arm == "llama-server":
                    wall, answers, extra = llama_server_run(a, tmp, names)
                elif arm == "warm":
                    store = os.path.join(tmp, f"store-{trial}")
                    swarmkv_run(a, tmp, "shared", store)  # cold: fills the store
                    wall, answers, extra = swarmkv_run(a, tmp, "shared", store)
                else:
                    wall, answers, extra = swarmkv_run(a, tmp, arm)
                measured[arm] = (wall, answers, extra)
            reference = measured["none"][1] if "none" in measured else untimed_reference
            for arm in arms:
                wall, answers, extra = measured[arm]
                same = None if arm == "llama-server" else answers == reference
                rows.append({"trial": trial, "arm": arm, "wall_s": round(wall, 3), "answers_equal_none": same,
                             **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in extra.items()}})
                trials.log(f"  {arm}: {wall:.1f} s, answers equal none's: {same}")
            report.write_json(results_path, {"rows": kept + rows})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = kept + rows
    shown_arms = [arm for arm in ARMS if any(r["arm"] == arm for r in rows)]
    medians = {arm: trials.median([r["wall_s"] for r in rows if r["arm"] == arm]) for arm in shown_arms}
    summary = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
               "model": os.path.basename(a.model), "documents": 20, "agents": len(AGENTS),
               "chars_per_document": a.chars, "n_predict": a.n_predict, "threads": a.threads,
               "trials": a.trials, "median_wall_s": medians,
               "speedup_vs_none": {arm: medians["none"] / medians[arm] for arm in shown_arms} if "none" in medians else {},
               "every_answer_equal_none": all(r["answers_equal_none"] for r in rows if r["answers_equal_none"] is not None)}
    if "cluster-1" in medians and "cluster-2" in medians:
        summary["two_workers_vs_one"] = medians["cluster-1"] / medians["cluster-2"]
    report.write_json(results_path, {"summary": summary, "rows": rows})
    header = ["trial", "arm", "wall_s", "answers_equal_none", "prefilled_tokens", "total_ms", "load_ms", "start_s",
              "requests_s"]
    report.write_csv(os.path.join(a.out, "results.csv"), header,
                     [{h: r.get(h, "") for h in header} for r in rows])
    fig, axes = style.figure(1, 1, width=7)
    ax = axes[0][0]
    drawn = style.grouped_bars(ax, ["20 documents x 4 agents"], shown_arms, lambda g, arm: medians[arm],
                               trials=lambda g, arm: [r["wall_s"] for r in rows if r["arm"] == arm],
                               value_fmt=lambda v: f"{v:.1f} s")
    style.value_scale(ax, drawn, suffix=" s")
    style.arm_legend(ax, shown_arms)
    style.panel_title(ax, f"End to end, model load included (median of {a.trials}; dots: trials)")
    style.save(fig, os.path.join(a.out, "corpus.png"))
    table = "\n".join(report.md_table(["arm", "median wall (s)", "vs none", "answers == none's"],
                            [[arm, f"{medians[arm]:.1f}", f"{summary['speedup_vs_none'].get(arm, 0):.2f}x",
                              "not compared (stock kernels)" if arm == "llama-server" else
                              str(all(r["answers_equal_none"] for r in rows if r["arm"] == arm))] for arm in shown_arms]))
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(f"# A corpus: 20 documents x 4 agents\n\n{summary['machine']}, {summary['model']}, "
                f"{a.threads} threads, {a.n_predict} greedy tokens per agent, documents of {a.chars} "
                f"characters, {a.trials} trials alternated, medians.\n\n{table}\n\n"
                + (f"Two workers of one thread against one: **{summary['two_workers_vs_one']:.2f}x** "
                   "(goal 1.8x).\n\n" if "two_workers_vs_one" in summary else "")
                + "![wall clock per arm](corpus.png)\n\nCommand: `command.sh`. Rows: `results.csv`.\n")
    print(table)


if __name__ == "__main__":
    main()
