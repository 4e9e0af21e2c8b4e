#!/bin/sh
# from the repository root; the local arms, then the cluster arms (rows of other arms are kept)
/usr/bin/python3 bench/corpus.py
/usr/bin/python3 bench/corpus.py --arms cluster-1,cluster-2
