#!/usr/bin/env python3
"""Peer benchmark: llama-server's own slot save/restore of a long prefix.

For each model and trial:
  process A (fresh llama-server):
    1. cold prefill: POST /completion (chat-templated system + document, n_predict 1)
    2. POST /slots/0?action=save    {"filename": ...}
    3. POST /slots/0?action=erase
    4. POST /slots/0?action=restore {"filename": ...}
    5. POST /completion, same prompt -> was the restored slot reused?
  process B (fresh llama-server, same --slot-save-path):
    6. POST /slots/0?action=restore, then POST /completion, same prompt.

Writes OUT/llama_server_slots.json (raw per-trial records + medians) and
OUT/llama_server_slots.md (summary table). Python stdlib only.

The host-RAM prompt cache is disabled by default (--cache-ram 0) so that any
reuse after restore can only come from the restored slot, not from the
server's in-memory prompt cache.
"""

import argparse
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import report  # noqa: E402
from swarmbench.ports import free_port  # noqa: E402
from swarmbench.servers import Process, http_ready  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

DEFAULT_SERVER = ("/root/.cache/swarmkv/llama.cpp/"
                  "0.3.36-be87fb641251-pe3f6dd2ca631-cpua63197e29d62/"
                  "install/bin/llama-server")
DEFAULT_MODEL = "/root/.cache/swarmkv/models/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_DOC = os.path.join(REPO, "examples/documents/apache-2.0.txt")
# Same system prompt as examples/pipelines/apache-license.yaml.
DEFAULT_SYSTEM = ("You are a careful legal analyst. "
                  "Answer only from the document, concisely.")
SLOT_FILE = "doc.bin"


def http(method, url, body=None, timeout=60.0):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw = e.read()
        status = e.code
    wall_ms = (time.perf_counter() - t0) * 1000.0
    try:
        js = json.loads(raw.decode() or "null")
    except ValueError:
        js = {"_raw": raw.decode(errors="replace")}
    return status, js, wall_ms


class Server:
    """One llama-server process; always stopped via stop() (use as context)."""

    def __init__(self, binary, model, save_dir, log_path, args):
        self.port = free_port()
        self.base = "http://127.0.0.1:%d" % self.port
        self.cmd = [binary, "-m", model, "--host", "127.0.0.1",
                    "--port", str(self.port), "-c", str(args.ctx),
                    "-np", "1", "-t", str(args.threads),
                    "--slot-save-path", save_dir, "--no-webui",
                    "--cache-ram", str(args.cache_ram),
                    # trace level: logs why a cached prompt is (not) reused
                    "-lv", "4"] + list(args.server_arg or [])
        self.log_path = log_path
        self.startup_timeout = args.startup_timeout
        self.proc = None

    def __enter__(self):
        with open(self.log_path, "ab") as log:
            log.write(("\n$ " + shlex.join(self.cmd) + "\n").encode())
        t0 = time.perf_counter()
        self.proc = Process(self.cmd, self.log_path, append=True, name="llama-server")
        self.proc.wait_ready(http_ready(self.port), self.startup_timeout)
        self.startup_ms = (time.perf_counter() - t0) * 1000.0
        return self

    def stop(self):
        if self.proc is not None:
            self.proc.stop(timeout=15)
        self.proc = None

    def __exit__(self, *exc):
        self.stop()
        return False

    def post(self, path, body, timeout):
        return http("POST", self.base + path, body, timeout=timeout)

    def log_offset(self):
        return self.proc.log_size()

    def log_since(self, off):
        return self.proc.log_text(off)


# Server log lines (trace level) that explain prompt-cache reuse decisions.
LOG_MARKERS = {
    "forced_full_reprocess": "forcing full prompt re-processing",
    "restored_checkpoint": "restored context checkpoint",
    "created_checkpoint": "created context checkpoint",
}


def must(status, js, what):
    if status != 200:
        raise RuntimeError("%s failed: HTTP %s %s" % (what, status,
                                                       json.dumps(js)[:500]))
    return js


def completion(srv, prompt, timeout):
    body = {"prompt": prompt, "n_predict": 1, "temperature": 0,
            "cache_prompt": True, "id_slot": 0}
    off = srv.log_offset()
    st, js, wall = srv.post("/completion", body, timeout)
    must(st, js, "/completion")
    log = srv.log_since(off)
    t = js.get("timings", {})
    return {
        "log_markers": {k: log.count(v) for k, v in LOG_MARKERS.items()},
        "wall_ms": wall,
        "content": js.get("content"),
        "tokens_evaluated": js.get("tokens_evaluated"),
        "tokens_cached": js.get("tokens_cached"),
        "timings.cache_n": t.get("cache_n"),
        "timings.prompt_n": t.get("prompt_n"),
        "timings.prompt_ms": t.get("prompt_ms"),
        "timings.predicted_n": t.get("predicted_n"),
        "timings": t,
        "response_keys": sorted(js.keys()),
    }


def slot_action(srv, action, body, timeout):
    st, js, wall = srv.post("/slots/0?action=" + action, body, timeout)
    rec = {"http_status": st, "wall_ms": wall, "response": js}
    if st != 200:
        rec["error"] = True
    return rec


def restore_and_complete(srv, prompt, path, args):
    rec = {}
    r = slot_action(srv, "restore", {"filename": SLOT_FILE}, args.req_timeout)
    rec["restore"] = r
    resp = r["response"] if isinstance(r["response"], dict) else {}
    rec["n_restored"] = resp.get("n_restored")
    rec["n_read"] = resp.get("n_read")
    rec["restore_ms"] = resp.get("timings", {}).get("restore_ms")
    rec["restore_ok"] = r["http_status"] == 200
    rec["completion"] = completion(srv, prompt, args.req_timeout)
    return rec


def run_trial(model, prompt, args, workdir, trial):
    save_dir = os.path.join(workdir, "slots")
    os.makedirs(save_dir, exist_ok=True)
    path = os.path.join(save_dir, SLOT_FILE)
    if os.path.exists(path):
        os.remove(path)
    log_path = os.path.join(workdir, "server.log")
    rec = {"trial": trial}

    # Process A: cold prefill, save, erase, restore, reuse.
    with Server(args.server, model, save_dir, log_path, args) as srv:
        rec["startup_ms_a"] = srv.startup_ms
        rec["cold"] = completion(srv, prompt, args.req_timeout)
        s = slot_action(srv, "save", {"filename": SLOT_FILE}, args.req_timeout)
        must(s["http_status"], s["response"], "slot save")
        rec["save"] = s
        rec["n_saved"] = s["response"].get("n_saved")
        rec["n_written"] = s["response"].get("n_written")
        rec["save_ms"] = s["response"].get("timings", {}).get("save_ms")
        rec["file_bytes"] = os.path.getsize(path)
        e = slot_action(srv, "erase", None, args.req_timeout)
        must(e["http_status"], e["response"], "slot erase")
        rec["erase"] = e
        rec["same_process"] = restore_and_complete(srv, prompt, path, args)
        # Control: the same prompt once more, no save/restore in between.
        rec["control_repeat"] = completion(srv, prompt, args.req_timeout)

    # Process B: a fresh server reading the file written by process A.
    with Server(args.server, model, save_dir, log_path, args) as srv:
        rec["startup_ms_b"] = srv.startup_ms
        rec["fresh_process"] = restore_and_complete(srv, prompt, path, args)
    return rec


def build_prompt(model, doc_text, args, workdir):
    """Chat-template [system, user=document] with the model's own template."""
    save_dir = os.path.join(workdir, "slots")
    os.makedirs(save_dir, exist_ok=True)
    with Server(args.server, model, save_dir,
                os.path.join(workdir, "server.log"), args) as srv:
        body = {"messages": [{"role": "system", "content": args.system},
                             {"role": "user", "content": doc_text}],
                "add_generation_prompt": True}
        st, js, _ = srv.post("/apply-template", body, args.req_timeout)
        if st == 200 and isinstance(js, dict) and js.get("prompt"):
            prompt, how = js["prompt"], "/apply-template"
        else:
            prompt, how = args.system + "\n\n" + doc_text, "raw text"
        st, js, _ = srv.post("/tokenize", {"content": prompt}, args.req_timeout)
        n_tok = len(js.get("tokens", [])) if st == 200 else None
    return prompt, how, n_tok


def med(vals):
    vals = [v for v in vals if isinstance(v, (int, float))]
    return statistics.median(vals) if vals else None


def summarise(trials):
    def col(f):
        return [f(t) for t in trials]

    def side(key):
        return {
            "restore_ok_all": all(t[key]["restore_ok"] for t in trials),
            "n_restored": med(col(lambda t: t[key]["n_restored"])),
            "n_read": med(col(lambda t: t[key]["n_read"])),
            "restore_ms": med(col(lambda t: t[key]["restore_ms"])),
            "restore_MB_per_s": med(col(
                lambda t: (t[key]["n_read"] / t[key]["restore_ms"] / 1000.0)
                if t[key]["restore_ms"] and t[key]["n_read"] else None)),
            "prompt_n_after": med(col(
                lambda t: t[key]["completion"]["timings.prompt_n"])),
            "cache_n_after": med(col(
                lambda t: t[key]["completion"]["timings.cache_n"])),
            "tokens_cached_after": med(col(
                lambda t: t[key]["completion"]["tokens_cached"])),
            "prompt_ms_after": med(col(
                lambda t: t[key]["completion"]["timings.prompt_ms"])),
            "forced_full_reprocess_trials": sum(
                1 for t in trials
                if t[key]["completion"]["log_markers"]["forced_full_reprocess"]),
            "same_token_as_cold_all": all(
                t[key]["completion"]["content"] == t["cold"]["content"]
                for t in trials),
        }
    return {
        "cold_prompt_n": med(col(lambda t: t["cold"]["timings.prompt_n"])),
        "cold_prompt_ms": med(col(lambda t: t["cold"]["timings.prompt_ms"])),
        "n_saved": med(col(lambda t: t["n_saved"])),
        "n_written": med(col(lambda t: t["n_written"])),
        "save_ms": med(col(lambda t: t["save_ms"])),
        "file_bytes": med(col(lambda t: t["file_bytes"])),
        "bytes_per_token": med(col(
            lambda t: t["file_bytes"] / t["n_saved"] if t["n_saved"] else None)),
        "control_repeat_prompt_n": med(col(
            lambda t: t["control_repeat"]["timings.prompt_n"])),
        "control_repeat_cache_n": med(col(
            lambda t: t["control_repeat"]["timings.cache_n"])),
        "loadavg_1m_max": max(max(t["loadavg_before"][0], t["loadavg_after"][0])
                              for t in trials),
        "same_process": side("same_process"),
        "fresh_process": side("fresh_process"),
    }


def fmt(v, nd=1):
    if v is None:
        return "-"
    if isinstance(v, float):
        return ("%%.%df" % nd) % v
    return str(v)


def write_md(path, results, argv, total_s):
    lines = []
    lines.append("# llama-server slot save/restore (peer for the snapshot store)")
    lines.append("")
    lines.append("Reproduce (from the repo root):")
    lines.append("")
    lines.append("```")
    lines.append(argv)
    lines.append("```")
    lines.append("")
    lines.append("Medians over trials. Each trial: fresh server, cold prefill "
                 "(`/completion`, n_predict 1, cache_prompt true), "
                 "`/slots/0?action=save`, `erase`, `restore`, same `/completion`"
                 " again (same process); then a fresh server process restores "
                 "the same file and runs the same `/completion` (fresh process)."
                 " Times are the server's own `timings.save_ms` / "
                 "`timings.restore_ms` / `timings.prompt_ms`. MB = 1e6 bytes; "
                 "the file is in the page cache on restore. Host-RAM prompt "
                 "cache off (`--cache-ram %s`)." % results["args"]["cache_ram"])
    lines.append("")
    hdr = ["model", "process", "prefix tok", "cold prefill ms", "save ms",
           "file bytes", "B/tok", "restore ms", "restore MB/s",
           "prompt_n after", "cache_n after", "full reprocess (log)",
           "same token"]
    lines.append("| " + " | ".join(hdr) + " |")
    lines.append("|" + "---|" * len(hdr))
    for m in results["models"]:
        s = m["median"]
        for key, label in (("same_process", "same"), ("fresh_process", "fresh")):
            p = s[key]
            ok = "" if p["restore_ok_all"] else " (restore FAILED)"
            lines.append("| " + " | ".join([
                os.path.basename(m["model"]), label + ok,
                fmt(s["n_saved"]), fmt(s["cold_prompt_ms"]), fmt(s["save_ms"]),
                fmt(s["file_bytes"]), fmt(s["bytes_per_token"], 0),
                fmt(p["restore_ms"]), fmt(p["restore_MB_per_s"], 0),
                fmt(p["prompt_n_after"]), fmt(p["cache_n_after"]),
                "%d/%d" % (p["forced_full_reprocess_trials"], len(m["trials"])),
                "yes" if p["same_token_as_cold_all"] else "NO",
            ]) + " |")
    lines.append("")
    lines.append("Control (same process, same prompt sent once more after the "
                 "restore test, no save/restore in between): prompt_n / cache_n "
                 "= " + ", ".join(
                     "%s %s / %s" % (os.path.basename(m["model"]),
                                     fmt(m["median"]["control_repeat_prompt_n"]),
                                     fmt(m["median"]["control_repeat_cache_n"]))
                     for m in results["models"]) + ".")
    lines.append("")
    lines.append("Extra llama-server args: `%s`. Max 1-min load average seen "
                 "around a trial: %s (2-core machine; cold prefill times are "
                 "sensitive to other load)." % (
                     " ".join(results["args"]["server_arg"] or []) or "none",
                     ", ".join("%s %.1f" % (os.path.basename(m["model"]),
                                            m["median"]["loadavg_1m_max"])
                               for m in results["models"])))
    lines.append("")
    lines.append("'full reprocess (log)' = trials whose post-restore "
                 "`/completion` logged 'forcing full prompt re-processing due "
                 "to lack of cache data' (server run at `-lv 4`).")
    lines.append("")
    lines.append("prefix tok = `n_saved` from the save response (cold "
                 "`timings.prompt_n` in the JSON). 'same token' = the one "
                 "greedy token after restore equals the cold run's. "
                 "Total run time: %.1f s." % total_s)
    lines.append("")
    with open(path, "w") as f:
        f.write("\n".join(lines))


def arguments():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append",
                    help="GGUF model (repeatable; default SmolLM2-135M Q4_1)")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(
        REPO, "bench/results/snapshot-store/peer"))
    ap.add_argument("--server", default=DEFAULT_SERVER)
    ap.add_argument("--document", default=DEFAULT_DOC)
    ap.add_argument("--system", default=DEFAULT_SYSTEM)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cache-ram", type=int, default=0,
                    help="llama-server --cache-ram MiB (default 0 = off)")
    ap.add_argument("--server-arg", action="append",
                    help="extra llama-server argument (repeatable; use "
                    "--server-arg=--swa-full for a leading dash)")
    ap.add_argument("--name", default="llama_server_slots",
                    help="output file stem in --out")
    ap.add_argument("--startup-timeout", type=float, default=120.0)
    ap.add_argument("--req-timeout", type=float, default=600.0)
    return ap


def timed_trial(model, prompt, args, workdir, i):
    """run_trial with its wall time and the load average around it, printed on one line."""
    t0 = time.perf_counter()
    la0 = os.getloadavg()
    rec = run_trial(model, prompt, args, workdir, i)
    rec["loadavg_before"] = la0
    rec["loadavg_after"] = os.getloadavg()
    rec["trial_wall_s"] = time.perf_counter() - t0
    print("  trial %d: cold %s tok %.0f ms | save %.1f ms %d B | "
          "same: restore %s ms prompt_n %s cache_n %s | "
          "fresh: restore %s ms prompt_n %s cache_n %s (%.1f s)" % (
              i, rec["cold"]["timings.prompt_n"],
              rec["cold"]["timings.prompt_ms"], rec["save_ms"],
              rec["file_bytes"],
              fmt(rec["same_process"]["restore_ms"]),
              rec["same_process"]["completion"]["timings.prompt_n"],
              rec["same_process"]["completion"]["timings.cache_n"],
              fmt(rec["fresh_process"]["restore_ms"]),
              rec["fresh_process"]["completion"]["timings.prompt_n"],
              rec["fresh_process"]["completion"]["timings.cache_n"],
              rec["trial_wall_s"]), flush=True)
    return rec


def main():
    args = arguments().parse_args()
    models = args.model or [DEFAULT_MODEL]

    argv = report.invocation("python3")
    os.makedirs(args.out, exist_ok=True)
    with open(args.document) as f:
        doc_text = f.read()

    t_start = time.perf_counter()
    results = {"command": argv, "server": args.server,
               "document": os.path.relpath(args.document, REPO),
               "args": {k: v for k, v in vars(args).items() if k != "model"},
               "models": []}
    for model in models:
        workdir = tempfile.mkdtemp(prefix="swarmkv-slots-")
        try:
            prompt, how, n_tok = build_prompt(model, doc_text, args, workdir)
            print("[%s] prompt via %s: %s tokens" %
                  (os.path.basename(model), how, n_tok), flush=True)
            trials = [timed_trial(model, prompt, args, workdir, i) for i in range(args.trials)]
            with open(os.path.join(workdir, "server.log"), "rb") as f:
                log_tail = f.read()[-4000:].decode(errors="replace")
            results["models"].append({
                "model": model, "prompt_built_via": how,
                "prompt_tokens_tokenize": n_tok, "trials": trials,
                "median": summarise(trials), "server_log_tail": log_tail})
        except Exception:
            lp = os.path.join(workdir, "server.log")
            if os.path.exists(lp):
                with open(lp, "rb") as f:
                    sys.stderr.write(f.read()[-4000:].decode(errors="replace"))
            raise
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    total_s = time.perf_counter() - t_start
    results["total_run_s"] = total_s
    with open(os.path.join(args.out, args.name + ".json"), "w") as f:
        json.dump(results, f, indent=1)
    write_md(os.path.join(args.out, args.name + ".md"), results, argv,
             total_s)
    print("total %.1f s -> %s" % (total_s, args.out))


if __name__ == "__main__":
    main()
