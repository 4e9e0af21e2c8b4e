#!/bin/sh
# from the repository root
/usr/bin/python3 bench/prefix_attention.py --bin build/release/swarmkv --before-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-p56c452853059-cpu4b4fbe1c1229/install/lib --after-lib /root/.cache/swarmkv/llama.cpp/0.3.36-50a8da4bab5b-p321311643827-cpu4b4fbe1c1229/install/lib --trials 3
