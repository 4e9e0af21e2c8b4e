"""Perplexity of each weight format under exact mode's arithmetic and under
llama.cpp's stock kernels (issue 56, item 4: choose the default weights by
measurement).

For every model x weight file x text, llama-perplexity of the pinned build,
512-token chunks, default batch, --threads, in two arms:

  exact  the switches SwarmKV sets for exact mode (src/engine/engine.cpp,
         row_invariant_kernels; Model::load, Context): GGML_CPU_SGEMM_SINGLE_ROW=1,
         GGML_CPU_FA_BATCH_INVARIANT=1 (and GGML_CPU_TILED_MM=0 only where
         libggml-cpu lacks ggml_cpu_has_tiled_batch_invariant), flash attention
         on, q8_0 K/V, and repacking as exact mode does it: with a libggml-cpu that has
         ggml_cpu_has_repack_batch_invariant the switch itself keeps every weight type but
         Q4_0 and IQ4_NL out of the repack buffer, else none is repacked (`--no-repack`):
         `-fa on -ctk q8_0 -ctv q8_0 [--no-repack]`
  stock  llama-perplexity's defaults: no switches, -fa auto, f16 K/V, repacking

The weight files besides the shipped ones are made once into --cache with
`llama-quantize --allow-requantize SRC OUT TYPE`. llama-perplexity is
deterministic (one run per point). Writes OUT/results.json, OUT/table.md,
OUT/command.sh.

usage: /usr/bin/python3 bench/perplexity.py [--llama PREFIX] [--out bench/results/perplexity]
           [--texts NAME=PATH,...] [--cache DIR] [--threads 2] [--resume]
"""
import argparse
import json
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # importing swarmbench must not leave a __pycache__ there
from swarmbench import MODEL, ROOT, report  # noqa: E402
from swarmbench.builds import cpu_model, requantised  # noqa: E402
from swarmbench.trials import log, run  # noqa: E402

CACHE = os.environ.get("SWARMKV_CACHE", os.path.expanduser("~/.cache/swarmkv"))
GEMMA3 = os.environ.get("SWARMKV_TEST_MODEL_GEMMA3", os.path.join(CACHE, "models", "gemma-3-270m-q4_k_m.gguf"))
# (model, weights, source file, llama-quantize type or None for the file itself); the first of each model is
# its baseline
WEIGHTS = [("SmolLM2-135M", "F16", MODEL, None), ("SmolLM2-135M", "Q8_0", MODEL, "Q8_0"),
           ("SmolLM2-135M", "Q4_0", MODEL, "Q4_0"), ("SmolLM2-135M", "Q4_K_M", MODEL, "Q4_K_M"),
           ("Gemma-3-270M", "Q4_K_M", GEMMA3, None), ("Gemma-3-270M", "Q8_0", GEMMA3, "Q8_0")]

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--llama", default=os.environ.get("SWARMKV_LLAMA_PREFIX"),
                help="llama.cpp prefix with bin/llama-perplexity and bin/llama-quantize (default: "
                     "$SWARMKV_LLAMA_PREFIX, else scripts/build-llama.sh's)")
ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "perplexity"))
ap.add_argument("--texts", default="GPL-3=/usr/share/common-licenses/GPL-3,MPL-2.0="
                + os.path.join(ROOT, "examples", "documents", "mpl-2.0.txt"))
ap.add_argument("--cache", default=os.path.join(CACHE, "perplexity"), help="where requantised files are made")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--arms", default="exact,stock,exact-f16kv", help="which arms to measure (table: exact, stock)")
ap.add_argument("--resume", action="store_true", help="keep the points OUT/results.json has")
ap.add_argument("--weights", help="only these MODEL:WEIGHTS, comma-separated (default: all), e.g. "
                                  "SmolLM2-135M:F16,SmolLM2-135M:Q4_0 (a model's first weights are its base)")
args = ap.parse_args()

llama = args.llama or subprocess.run([os.path.join(ROOT, "scripts", "build-llama.sh")], capture_output=True,
                                     text=True, check=True).stdout.strip()
texts = dict(t.split("=", 1) for t in args.texts.split(","))
os.makedirs(args.out, exist_ok=True)
os.makedirs(args.cache, exist_ok=True)
results_path = os.path.join(args.out, "results.json")
old = json.load(open(results_path)) if args.resume and os.path.exists(results_path) else {}
report.write_command(args.out)

cpu_lib = os.path.join(llama, "lib", "libggml-cpu.so")
cpu_symbols = subprocess.run(["nm", "-D", cpu_lib], capture_output=True, text=True).stdout
tiles_invariant = "ggml_cpu_has_tiled_batch_invariant" in cpu_symbols
repack_invariant = "ggml_cpu_has_repack_batch_invariant" in cpu_symbols
if args.weights:
    WEIGHTS = [w for w in WEIGHTS if f"{w[0]}:{w[1]}" in args.weights.split(",")]
exact_env = {"GGML_CPU_SGEMM_SINGLE_ROW": "1", "GGML_CPU_FA_BATCH_INVARIANT": "1"}
if not tiles_invariant:
    exact_env["GGML_CPU_TILED_MM"] = "0"
no_repack = [] if repack_invariant else ["--no-repack"]
ARMS = {"exact": (exact_env, ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", *no_repack]), "stock": ({}, []),
        # exact's kernels with stock's f16 K/V: splits exact vs stock into the K/V type and the kernels
        "exact-f16kv": (exact_env, ["-fa", "on", *no_repack])}
SWITCHES = ("GGML_CPU_SGEMM_SINGLE_ROW", "GGML_CPU_FA_BATCH_INVARIANT", "GGML_CPU_TILED_MM", "LLAMA_ARG_FLASH_ATTN",
            "LLAMA_ARG_REPACK")
base_env = {k: v for k, v in os.environ.items() if k not in SWITCHES}


def weight_file(src, qtype):
    if qtype is None:
        return src
    out = os.path.join(args.cache, f"{os.path.basename(src).rsplit('.gguf', 1)[0]}.to-{qtype}.gguf")
    return requantised(os.path.join(llama, "bin"), src, qtype, out, args.threads)


def perplexity(path, text, arm):
    env, flags = ARMS[arm]
    cmd = [os.path.join(llama, "bin", "llama-perplexity"), "-m", path, "-f", text, "-c", "512",
           "-t", str(args.threads), "-lv", "4", *flags]
    out = run(cmd, env=dict(base_env, **env))
    text_out = out.stdout + out.stderr
    found = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", text_out)
    if not found:
        sys.exit(f"llama-perplexity printed no final estimate: {' '.join(cmd)}")
    grab = lambda pattern: (re.search(pattern, text_out) or [None, None])[1]  # noqa: E731
    return {"ppl": float(found[1]), "ppl_stderr": float(found[2]),
            "chunks": int(grab(r"over (\d+) chunks") or 0), "batch": grab(r"batch_size=(\d+)"),
            "flash_attention": grab(r"Flash Attention (\w+)") or grab(r"flash_attn\s+= (\w+)"), "kv": grab(r"K \((\w+)\)"),
            "repacked_bytes_mib": float(grab(r"CPU_REPACK model buffer size =\s+([0-9.]+) MiB") or 0),
            "env": env, "flags": flags}


cpu = cpu_model()
results = {"environment": {"cpu": cpu, "cores": os.cpu_count(), "llama": llama,
                           "tiled_batch_invariant": tiles_invariant, "repack_batch_invariant": repack_invariant},
           "params": {"texts": texts, "n_ctx": 512, "threads": args.threads, "trials": 1,
                      "arms": {a: {"env": e, "flags": f} for a, (e, f) in ARMS.items()}},
           "points": old.get("points", []), "kld": old.get("kld", {})}
done = {(p["model"], p["weights"], p["text"], p["arm"]) for p in results["points"]}
for model, weights, src, qtype in WEIGHTS:
    path = weight_file(src, qtype)
    for tname, tpath in texts.items():
        for arm in args.arms.split(","):
            if (model, weights, tname, arm) in done:
                continue
            r = perplexity(path, tpath, arm)
            log(f"{model} {weights} {tname} {arm}: PPL {r['ppl']} +/- {r['ppl_stderr']}")
            results["points"].append(dict(model=model, weights=weights, text=tname, arm=arm, file=path,
                                          size_bytes=os.path.getsize(path), **r))
            report.write_json(results_path, results, indent=1)

# Paired: each weight file's token probabilities against its model's first weights', exact arm
# (llama-perplexity --kl-divergence); the ratio of perplexities with the error of the paired difference.
for model, weights, src, qtype in WEIGHTS:
    base = next(w for m, w, _, _ in WEIGHTS if m == model)
    for tname, tpath in texts.items():
        key = f"{model} {weights} {tname}"
        if weights == base or key in results["kld"]:
            continue
        logits = os.path.join(args.cache, f"{model}.{base}.{tname}.exact.kld-base")
        env, flags = ARMS["exact"]
        ppl = [os.path.join(llama, "bin", "llama-perplexity"), "-c", "512", "-t", str(args.threads), *flags]
        if not os.path.exists(logits):
            base_file = next(p["file"] for p in results["points"] if (p["model"], p["weights"]) == (model, base))
            run([*ppl, "-m", base_file, "-f", tpath, "--kl-divergence-base", logits + ".part"],
                env=dict(base_env, **env))
            os.replace(logits + ".part", logits)
        p = run([*ppl, "-m", weight_file(src, qtype), "--kl-divergence-base", logits, "--kl-divergence"],
                env=dict(base_env, **env))
        found = re.search(r"Mean\s+PPL\(Q\)/PPL\(base\)\s*:\s*([0-9.]+)\s*±\s*([0-9.]+)", p.stdout + p.stderr)
        kld = re.search(r"Mean\s+KLD:\s*([0-9.]+)\s*±\s*([0-9.]+)", p.stdout + p.stderr)
        top = re.search(r"Same top p:\s*([0-9.]+)\s*±\s*([0-9.]+)", p.stdout + p.stderr)
        if not found:
            sys.exit(f"no PPL(Q)/PPL(base) for {key}:\n{(p.stdout + p.stderr)[-2000:]}")
        results["kld"][key] = {"model": model, "weights": weights, "base": base, "text": tname,
                               "ppl_ratio": float(found[1]), "ppl_ratio_stderr": float(found[2]),
                               "mean_kld": kld and float(kld[1]), "same_top_pct": top and float(top[1])}
        log(f"{key} vs {base}: PPL ratio {found[1]} +/- {found[2]}")
        report.write_json(results_path, results, indent=1)
report.write_json(results_path, results, indent=1)
for f in os.listdir(args.cache):  # the base logits: up to 2 GB each (Gemma 3's 262,144-token vocabulary)
    if f.endswith(".kld-base"):
        os.remove(os.path.join(args.cache, f))


def point(model, weights, text, arm):
    return next((p for p in results["points"] if (p["model"], p["weights"], p["text"], p["arm"]) ==
                 (model, weights, text, arm)), None)


def ppl(p):
    return f"{p['ppl']:.4f} ± {p['ppl_stderr']:.4f}" if p else "-"


rows = []
for model, weights, _, _ in WEIGHTS:
    base = next(w for m, w, _, _ in WEIGHTS if m == model)
    for tname in texts:
        e, s, f16kv, b = (point(model, weights, tname, "exact"), point(model, weights, tname, "stock"),
                          point(model, weights, tname, "exact-f16kv"), point(model, base, tname, "exact"))
        k = results["kld"].get(f"{model} {weights} {tname}")
        rows.append([model, weights, f"{e['size_bytes'] / 1e6:.1f}", tname, e["chunks"], ppl(e), ppl(s),
                     f"{100 * (e['ppl'] / b['ppl'] - 1):+.2f} %",
                     f"{100 * (k['ppl_ratio'] - 1):+.2f} ± {100 * k['ppl_ratio_stderr']:.2f} %" if k else "-",
                     f"{100 * (e['ppl'] / s['ppl'] - 1):+.2f} %", ppl(f16kv)])
with open(os.path.join(args.out, "table.md"), "w") as f:
    f.write("\n".join(report.md_table(
        ["model", "weights", "file MB", "text", "512-token chunks", "exact PPL ±", "stock PPL ±",
         "exact vs base (F16; Gemma: Q4_K_M), exact", "paired (--kl-divergence)",
         "exact vs stock", "exact kernels, f16 K/V"], rows)) + "\n")
log(f"results in {args.out}")
