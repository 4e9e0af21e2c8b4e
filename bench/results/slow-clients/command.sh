#!/usr/bin/env bash
# what produced this directory
/usr/bin/python3 bench/slow_clients.py --binary old=/tmp/w/old/build/swarmkv --binary new=build/release/swarmkv --out bench/results/slow-clients --probe-timeout 10
