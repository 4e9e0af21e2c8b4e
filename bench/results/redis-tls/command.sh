#!/bin/sh
# from the repository root, after scripts/bench.sh built build/release
/usr/bin/python3 bench/redis_tls.py --bin build/release --rounds 3 --trials 5
