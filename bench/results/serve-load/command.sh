#!/bin/sh
# from the repository root
/usr/bin/python3 bench/serve_load.py --bin build/release/swarmkv --trials 3
