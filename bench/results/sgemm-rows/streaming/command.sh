#!/bin/sh
# from the repository root
/usr/bin/python3 bench/streaming_prefill.py --bin build/release/swarmkv --before-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-p321311643827-cpu4b4fbe1c1229/install/lib --after-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-pb1153d4dcc2f-cpu4b4fbe1c1229/install/lib --out bench/results/sgemm-rows/streaming --trials 7 --change '"before": the sgemm patch of abbe4d3, where exact mode'"'"'s one-row products went through 4-row tiles; "after": products of up to six rows take one weight row at a time (8e4fe5f).'
