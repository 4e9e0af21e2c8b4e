#!/usr/bin/env bash
# Test certificates for TLS to Redis, made in DIR (EC P-256: milliseconds):
#   test-ca.pem/.key   a CA
#   server.pem/.key    its certificate for 127.0.0.1 only (no DNS name, so
#                      "localhost" does not match it)
#   client.pem/.key    its client certificate
#   other-ca.pem/.key  another CA
#   stranger.pem/.key  the other CA's certificate for 127.0.0.1
#
#   make_test_certificates.sh DIR
set -euo pipefail
mkdir -p "$1"
cd "$1"
key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"; }
ca() { key "$1"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1"; }
leaf() {
  key "$1"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$1"
  printf 'subjectAltName=%s\n' "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 2 \
    -extfile "$1.ext" -out "$1.pem" 2>/dev/null
}
ca test-ca
ca other-ca
leaf server test-ca IP:127.0.0.1
leaf client test-ca DNS:swarmkv-client
leaf stranger other-ca IP:127.0.0.1
