#!/usr/bin/env bash
# Builds the SGLang environment the `sglang` engine runs in (server.python = .venv-sglang/bin/python):
#   1. a Python 3.11 venv with sglang==<SUPPORTED_SGLANG[0] of eagle3/store/dump_protocol.py, the one place the
#      release is pinned> (~11 GB, ~3.5 min);
#   2. our hidden-state hook: server_patch/ plus the eagle3 modules it imports (eagle3/__init__.py and
#      eagle3/store/: __init__.py, fsio.py, sample_format.py, dump_protocol.py) staged into deploy/server_patch_pkg/ and pip-installed as the package
#      `eagle3-server-patch`, whose entry point (group sglang.srt.plugins) SGLang loads in every scheduler;
#   3. on a machine without a GPU, a stub libcuda.so.1 in <venv>/stub/ whose four functions return
#      CUDA_ERROR_NO_DEVICE, so the CUDA build of torch imports and SGLang runs with --device cpu.
#
# Cached: <venv>/.stamp-base holds the sha256 of the requirement (+ python version), <venv>/.stamp-plugin
# that of the plugin source. A matching stamp skips its step; a changed plugin reinstalls only the plugin.
#
# Environment: SGLANG_VENV (default .venv-sglang), SGLANG_PYTHON (default python3.11),
#              EAGLE3_CUDA_STUB=1|0 to force / skip the stub (default: build it when nvidia-smi is absent).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${SGLANG_VENV:-.venv-sglang}"
PY="${SGLANG_PYTHON:-python3.11}"
# the pin, read from its one place (SUPPORTED_SGLANG = ("X.Y.Z",) in eagle3/store/dump_protocol.py)
SGLANG_VERSION="$(sed -n 's/^SUPPORTED_SGLANG = ("\([^"]*\)".*/\1/p' eagle3/store/dump_protocol.py)"
[ -n "$SGLANG_VERSION" ] || { echo "sglang_env: no SUPPORTED_SGLANG line in eagle3/store/dump_protocol.py" >&2; exit 1; }
REQ="sglang==$SGLANG_VERSION"  # sglang pins its own torch and transformers
PKG=deploy/server_patch_pkg
PLUGIN_SRC=(server_patch/*.py eagle3/__init__.py eagle3/store/__init__.py eagle3/store/fsio.py eagle3/store/sample_format.py eagle3/store/dump_protocol.py "$PKG/pyproject.toml")

log() { echo "sglang_env: $*" >&2; }
sha() { cat "$@" | sha256sum | cut -c1-16; }

base_key="$(echo "$REQ" | sha256sum | cut -c1-16)-$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
plugin_key="$(sha "${PLUGIN_SRC[@]}")"

# 1. SGLang itself ------------------------------------------------------------------------------------
if [ "$(cat "$VENV/.stamp-base" 2>/dev/null)" != "$base_key" ]; then
  log "installing $REQ into $VENV (about 11 GB, a few minutes)"
  rm -f "$VENV/.stamp-base" "$VENV/.stamp-plugin"
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip setuptools
  "$VENV/bin/pip" install -q "$REQ"
  echo "$base_key" > "$VENV/.stamp-base"
else
  log "$VENV is up to date ($REQ)"
fi

# 2. The plugin ---------------------------------------------------------------------------------------
if [ "$(cat "$VENV/.stamp-plugin" 2>/dev/null)" != "$plugin_key" ]; then
  log "installing the server_patch plugin into $VENV"
  stage="$(mktemp -d)"
  trap 'rm -rf "$stage"' EXIT
  cp "$PKG/pyproject.toml" "$stage/"
  mkdir -p "$stage/server_patch" "$stage/eagle3/store"
  cp server_patch/*.py "$stage/server_patch/"
  cp eagle3/__init__.py "$stage/eagle3/"
  cp eagle3/store/__init__.py eagle3/store/fsio.py eagle3/store/sample_format.py eagle3/store/dump_protocol.py \
    "$stage/eagle3/store/"
  "$VENV/bin/pip" install -q --no-deps --no-build-isolation --force-reinstall "$stage"
  # Check from a neutral directory that the installed copy (not a source folder) is what imports.
  vpy="$(cd "$VENV" && pwd)/bin/python"
  (cd / && "$vpy" -c \
    'import importlib.metadata as m, server_patch, eagle3.store.sample_format as f;
eps = [e.value for e in m.entry_points(group="sglang.srt.plugins")];
assert "server_patch:load_plugin" in eps, eps; print("sglang_env: plugin entry points", eps)') >&2
  echo "$plugin_key" > "$VENV/.stamp-plugin"
fi

# 3. Stub libcuda on machines without a GPU -------------------------------------------------------------
want_stub="${EAGLE3_CUDA_STUB:-auto}"
if [ "$want_stub" = auto ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then want_stub=0; else want_stub=1; fi
fi
if [ "$want_stub" = 1 ] && [ ! -f "$VENV/stub/libcuda.so.1" ]; then
  log "no GPU: building the stub libcuda.so.1 into $VENV/stub/"
  mkdir -p "$VENV/stub"
  cat > "$VENV/stub/cuda_stub.c" <<'EOF'
/* Stub CUDA driver for CPU-only machines: every entry point reports CUDA_ERROR_NO_DEVICE (100). */
int cuInit(unsigned int flags) { (void)flags; return 100; }
int cuDriverGetVersion(int *v) { if (v) *v = 0; return 100; }
int cuDeviceGetCount(int *n) { if (n) *n = 0; return 100; }
int cuPointerGetAttribute(void *d, int a, unsigned long long p) { (void)d; (void)a; (void)p; return 100; }
EOF
  gcc -shared -fPIC -O2 -Wl,-soname,libcuda.so.1 -o "$VENV/stub/libcuda.so.1" "$VENV/stub/cuda_stub.c"
  ln -sf libcuda.so.1 "$VENV/stub/libcuda.so"
fi
log "ready: $VENV/bin/python$([ -f "$VENV/stub/libcuda.so.1" ] && echo " (CPU: LD_LIBRARY_PATH=$VENV/stub)")"
