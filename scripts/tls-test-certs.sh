#!/usr/bin/env bash
# Makes a throwaway CA and certificates for TLS tests and trials (docs/tls.md), with the openssl CLI:
#   ca.pem                      the CA (ca.key its key)
#   server.pem, server.key      a server certificate for 127.0.0.1-127.0.0.3 and localhost, usable as a client
#                               certificate too (servers show it to their peers under --tls-client-ca)
#   client.pem, client.key      a client certificate from the same CA
#   other-ca.pem                a second, unrelated CA
#   other-client.pem/.key       a client certificate from the second CA (one a server must refuse)
# Usage: scripts/tls-test-certs.sh OUTDIR. Not for production: the keys are written unencrypted.
set -euo pipefail
out=${1:?usage: $0 OUTDIR}
mkdir -p "$out"
cd "$out"

key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

ca() { # ca NAME SUBJECT
  key "$1.key"
  openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 30 -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

leaf() { # leaf NAME CA SUBJECT EXTENSIONS
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$3" 2>/dev/null
  printf '%s\n' "$4" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -out "$1.pem" -days 30 \
    -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}

ca ca "ramgrid test CA"
ca other-ca "another test CA"
leaf server ca "ramgrid test server" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,DNS:localhost"
leaf client ca "ramgrid test client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
leaf other-client other-ca "an outsider" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
rm -f ./*.srl
