"""The SGLang launch: command line and environment (eagle3/serving/server.py), no server needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from eagle3.config import ServerConfig
from eagle3.serving.layers import sglang_layer_ids
from eagle3.serving.server import (
    ServerError,
    SGLangServer,
    build_command,
    build_env,
    last_exception,
    server_device,
    shell_line,
)
from eagle3.store import dump_protocol as proto

LAYERS = sglang_layer_ids("llama", [2, 15, 27], 30)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_command_has_the_model_the_capture_flags_and_no_radix_cache(tmp_path: Path) -> None:
    cfg = ServerConfig(engine="sglang", tp=8, dtype="bfloat16", mem_fraction=0.8, chunked_prefill_size=8192,
                       max_total_tokens=200000, extra_args=["--cuda-graph-max-bs-prefill", "4"])  # fmt: skip
    argv = build_command(cfg, tmp_path / "model", LAYERS, port=30123, device="cuda")
    assert argv[1:3] == ["-m", "sglang.launch_server"] and Path(argv[0]).is_absolute()
    assert flag(argv, "--model-path") == str((tmp_path / "model").absolute())
    assert (flag(argv, "--tp-size"), flag(argv, "--dtype"), flag(argv, "--port")) == ("8", "bfloat16", "30123")
    assert flag(argv, "--host") == "127.0.0.1"
    assert "--disable-radix-cache" in argv and "--skip-tokenizer-init" in argv
    assert "--enable-return-aux-hidden-states" in argv and flag(argv, "--speculative-algorithm") == "EAGLE3"
    i = argv.index("--return-aux-hidden-state-layer-ids")
    assert argv[i + 1 : i + 4] == ["1", "14", "26"]
    assert flag(argv, "--mem-fraction-static") == "0.8" and flag(argv, "--chunked-prefill-size") == "8192"
    assert flag(argv, "--max-total-tokens") == "200000"
    assert argv[-2:] == ["--cuda-graph-max-bs-prefill", "4"] and "--device" not in argv


def test_server_prefix_cache_keeps_the_radix_cache_on_with_capture_and_without() -> None:
    for layers in (LAYERS, None):
        argv = build_command(ServerConfig(engine="sglang", prefix_cache=True), Path("m"), layers, port=1, device="cuda")
        assert "--disable-radix-cache" not in argv and "--skip-tokenizer-init" in argv
    argv = build_command(ServerConfig(engine="sglang", prefix_cache=True), Path("m"), LAYERS, port=1, device="cuda")
    assert "--enable-return-aux-hidden-states" in argv  # capture as without the cache: extraction requests are salted


def test_cpu_adds_the_cpu_engine_and_the_stub_libcuda() -> None:
    cfg = ServerConfig(engine="sglang", device="cpu", python=".venv-sglang/bin/python")
    argv = build_command(cfg, Path("m"), LAYERS, port=1, device="cpu")
    assert flag(argv, "--device") == "cpu" and "--sleep-on-idle" in argv
    env = build_env(cfg, {"LD_LIBRARY_PATH": "/opt/lib", "PATH": "/bin"}, device="cpu", dump_dir=None, aux_layers=None)
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env[proto.ENV_CPU_FORK] == "1"  # children forked on CPU only
    stub, rest = env["LD_LIBRARY_PATH"].split(":")
    assert stub.endswith(".venv-sglang/stub") and Path(stub).is_absolute() and rest == "/opt/lib"
    # no 5 s "let GPU activity settle" sleep on each stop of a CPU server, unless the caller asks for the dumps
    assert env["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == env["SGLANG_CUDA_COREDUMP_BEFORE_CRASH"] == "0"
    asked = build_env(cfg, {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "1"}, device="cpu", dump_dir=None, aux_layers=None)
    assert asked["SGLANG_PYSPY_DUMP_BEFORE_CRASH"] == "1"


def test_the_environment_passes_nccl_and_cuda_through_and_sets_the_hook(tmp_path: Path) -> None:
    cfg = ServerConfig(engine="sglang", env={"NCCL_P2P_DISABLE": "1"})
    base = {"NCCL_IB_HCA": "mlx5", "CUDA_VISIBLE_DEVICES": "0,1", "EAGLE3_DUMP_DIR": "/stale", "HOME": "/root"}
    env = build_env(cfg, base, device="cuda", dump_dir=tmp_path / "d", aux_layers=[2, 15, 27])
    assert env["NCCL_IB_HCA"] == "mlx5" and env["CUDA_VISIBLE_DEVICES"] == "0,1" and env["NCCL_P2P_DISABLE"] == "1"
    assert env[proto.ENV_DUMP_DIR] == str((tmp_path / "d").absolute())
    assert env[proto.ENV_AUX_LAYERS] == "2,15,27" and env[proto.ENV_RID_PREFIX] == "e3-"
    assert env["PYTHONUNBUFFERED"] == "1" and "SGLANG_USE_CPU_ENGINE" not in env
    assert "SGLANG_PYSPY_DUMP_BEFORE_CRASH" not in env  # SGLang's crash diagnostics stay on where a GPU runs
    plain = build_env(cfg, base, device="cuda", dump_dir=None, aux_layers=None)
    assert not any(k.startswith("EAGLE3_") for k in plain)  # a stale switch never leaks into a plain server


def test_without_capture_the_baseline_server_has_no_capture_flags() -> None:
    argv = build_command(ServerConfig(engine="sglang"), Path("m"), None, port=1, device="cuda")
    assert "--enable-return-aux-hidden-states" not in argv and "--disable-radix-cache" in argv


def test_auto_device_follows_nvidia_smi() -> None:
    cfg = ServerConfig(engine="sglang")
    assert server_device(cfg, which=lambda _: "/usr/bin/nvidia-smi") == "cuda"
    assert server_device(cfg, which=lambda _: None) == "cpu"


def test_the_shell_line_shows_only_the_changed_environment() -> None:
    line = shell_line(["python", "-m", "x y"], {"A": "1", "B": "2"}, {"A": "1"})
    assert line == "B=2 python -m 'x y'"


def test_a_missing_interpreter_is_an_error_that_names_the_setup_script(tmp_path: Path) -> None:
    cfg = ServerConfig(engine="sglang", device="cpu", python=str(tmp_path / "nope" / "bin" / "python"))
    server = SGLangServer(cfg, tmp_path, dump_dir=tmp_path / "d", layers=LAYERS, log_dir=tmp_path / "log", base_env={})
    with pytest.raises(ServerError, match=r"deploy/sglang_env\.sh"):
        server.start()


def test_attach_mode_uses_the_url_and_never_launches(tmp_path: Path) -> None:
    cfg = ServerConfig(engine="sglang", url="http://gpu-node:30000/", startup_timeout_s=1)
    server = SGLangServer(cfg, tmp_path, dump_dir=tmp_path / "d", layers=LAYERS, log_dir=tmp_path / "log", base_env={})
    assert server.attached and server.url == "http://gpu-node:30000"
    with pytest.raises(ServerError, match="did not answer /health"):
        server.start()
    assert not (tmp_path / "log").exists()


def test_the_last_exception_line_of_a_log_is_found_behind_a_logger_prefix_and_before_later_lines() -> None:
    log = "\n".join(
        [
            "[2026-12-05 02:05:30] server_args=ServerArgs(model_path='m', ...)",
            "[2026-12-05 02:05:41 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/v/sglang/srt/managers/scheduler.py", line 3020, in run_scheduler_process',
            "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank)",
            "                ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
            "ValueError: Model architectures ['FooForCausalLM'] are not supported for now.",
            "",
            "[2026-12-05 02:05:41] Received sigquit from a child process. It usually means the child failed.",
        ]
    )
    assert last_exception(log) == "ValueError: Model architectures ['FooForCausalLM'] are not supported for now."
    assert last_exception("[x] torch.OutOfMemoryError: CUDA out of memory.\nbye") == (
        "torch.OutOfMemoryError: CUDA out of memory."
    )
    assert last_exception("KeyboardInterrupt") == "KeyboardInterrupt"
    # A line that only mentions an error, a warning and the traceback's caret line are not the exception.
    assert last_exception("  File x, line 3\n    ^^^^^^\nUserWarning: slow\nthe scheduler saw no Error here") is None
