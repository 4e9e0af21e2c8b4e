"""The bench harness: what every script in bench/ shares, so that a bench
script holds only what it measures.

    ports    free_port()
    servers  Process (a child with its log, stopped by signal), wait_until,
             http_ready / tcp_ready / log_says, serve() and redis() started
             and waited for
    trials   alternate() (the arms' order, swapped every other trial),
             median(), percentile(), run() (a command that must succeed),
             log()
    report   invocation() / write_command() (the command line that
             reproduces a run), write_json() (atomic), write_csv(),
             md_table(), prometheus() (a counter from /metrics text)
    style    the plots' look and their one colour table (matplotlib)
    builds   one swarmkv binary timed on two llama.cpp builds

A script in bench/ imports it as `import swarmbench` (bench/ is its
sys.path[0]); one in bench/results/*/ puts bench/ on sys.path first. Set
sys.dont_write_bytecode = True before importing, so that no __pycache__ is
left in the tree. Only `style` needs matplotlib (Debian's
python3-matplotlib: run with /usr/bin/python3).
"""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The repository root."""

MODEL = os.environ.get(
    "SWARMKV_TEST_MODEL",
    os.path.expanduser("~/.cache/swarmkv/models/SmolLM2-135M-Instruct.F16.gguf"))
"""The default model: $SWARMKV_TEST_MODEL, else SmolLM2-135M-Instruct F16 in swarmkv's cache."""
