#!/bin/sh
# from the repository root
/usr/bin/python3 bench/sgemm_rows.py --bin build/release/swarmkv --before-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-p321311643827-cpu4b4fbe1c1229/install/lib --after-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-pb1153d4dcc2f-cpu4b4fbe1c1229/install/lib --llama-bench /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-pb1153d4dcc2f-cpu4b4fbe1c1229/install/bin/llama-bench --trials 3
