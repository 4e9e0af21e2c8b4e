#!/bin/sh
# from the repository root, with scripts/lib.sh's ensure_llama (SWARMKV_LLAMA_PREFIX) and
# scripts/fetch-model.sh's models (SWARMKV_TEST_MODEL, SWARMKV_TEST_MODEL_GEMMA3) exported.
# One run of everything:
#   nice -n 19 /usr/bin/python3 bench/perplexity.py
# What produced these results, in three passes (the first ran an earlier draft of the script
# without arguments, which then had the arms exact and stock only: the same as --arms exact,stock;
# the paired section and the exact-f16kv arm were added between passes):
nice -n 19 /usr/bin/python3 bench/perplexity.py --arms exact,stock
nice -n 19 /usr/bin/python3 bench/perplexity.py --arms exact,stock --resume
nice -n 19 /usr/bin/python3 bench/perplexity.py --resume
