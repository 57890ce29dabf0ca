#!/usr/bin/env bash
# Builds a peer trainer's environment for bench/peers/ (issue 48): one pinned venv per peer, apart from ours.
#   bash deploy/peer_env.sh speculators   -> .venv-speculators/  speculators==0.9.0 (+ torch 2.13.0, the CPU
#                                            wheel pip finds locally, inside speculators' 2.9-2.14.1 range)
#   bash deploy/peer_env.sh specforge     -> .venv-specforge/    specforge==0.2.0 (pins torch 2.11.0,
#                                            transformers 5.8.1 and sglang 0.5.14: the large one)
# Cached like deploy/sglang_env.sh: <venv>/.stamp holds the sha256 of the requirement line + python version;
# a matching stamp skips the install. The install's seconds go to <venv>/.install-seconds (docs/performance.md).
#
# Environment: PEER_PYTHON (default python3.11).
set -euo pipefail
cd "$(dirname "$0")/.."
peer="${1:?usage: peer_env.sh speculators|specforge}"
PY="${PEER_PYTHON:-python3.11}"
case "$peer" in
  # torch 2.13.0 is ours (pyproject.toml): the same kernels on both sides of a speed ratio.
  speculators) REQ=(speculators==0.9.0 torch==2.13.0) ;;
  specforge) REQ=(specforge==0.2.0) ;;
  *) echo "peer_env: unknown peer $peer (speculators|specforge)" >&2; exit 2 ;;
esac
VENV=".venv-$peer"
log() { echo "peer_env: $*" >&2; }
key="$(echo "${REQ[*]}" | sha256sum | cut -c1-16)-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" = "$key" ]; then
  log "$VENV is up to date (${REQ[*]})"; exit 0
fi
log "installing ${REQ[*]} into $VENV"
rm -f "$VENV/.stamp"
start=$(date +%s)
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "${REQ[@]}"
if [ "$peer" = speculators ]; then
  # speculators requires torchvision and torchaudio but imports neither; PyPI's builds are linked against the CUDA
  # torch, and with the CPU torch transformers' import of torchvision fails ("operator torchvision::nms does not
  # exist"), so speculators cannot import at all. Without them transformers skips its vision imports.
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio
fi
"$VENV/bin/python" -c "import $peer" >&2  # the peer imports, or the stamp is not written
echo $(( $(date +%s) - start )) > "$VENV/.install-seconds"
echo "$key" > "$VENV/.stamp"
log "ready: $VENV/bin/python ($(cat "$VENV/.install-seconds") s)"
