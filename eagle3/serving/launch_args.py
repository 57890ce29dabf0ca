"""SGLang launch flags that silently skip the capture, refused in the servers' own flags (`server.extra_args`).

    capture_args_problem(server)   why `server.extra_args` would leave layers uncaptured, or None
    flag_values(args, flag)        what `args` gives a flag SGLang reads (its argparse prefixes too)

Read in SGLang 0.5.23's model files (TWO_BATCH_OVERLAP_SKIPS): with `--enable-two-batch-overlap`, a batch that can
be split (`forward_batch.can_run_tbo`) runs its layers (all of them, or those after the dense ones) through
`model_forward_stages`, outside the loop that appends to the aux hidden states. The server starts, most layers are
never captured, and whether a batch is split depends on its size: a store, or a served draft, would miss its states
with no error. mimo_v2.py turns the overlap off while capturing, glm5_next.py only for DFlash. Single-batch overlap
(`--enable-single-batch-overlap`) overlaps communication inside a MoE layer and leaves the capture loop as it is, so
it is not refused.
tests/unit/target/test_sglang_source.py reads the files again and fails when the list is no longer the one
SGLang's source gives.
"""

from __future__ import annotations

from eagle3.config import ServerConfig

#: The model files whose capture loop the two-batch overlap bypasses (deepseek_v2.py serves Kimi-K2/K2.5 and GLM-5
#: DSA too; qwen2_moe.py serves Qwen3-MoE).
TWO_BATCH_OVERLAP_SKIPS = ("deepseek_v2.py", "glm4_moe.py", "glm4_moe_lite.py", "glm5_next.py", "minimax_m2.py",
                           "minimax_m3.py", "qwen2_moe.py")  # fmt: skip
#: The flags, each with why it is refused.
CAPTURE_SKIPPING_FLAGS: dict[str, str] = {
    "--enable-two-batch-overlap": "SGLang's two-batch overlap runs the layers (all, or those after the dense ones) "
    f"outside the loop that captures them ({', '.join(TWO_BATCH_OVERLAP_SKIPS)}), so those layers' states would be "
    "missing from whichever batches it splits, with no error",
}
#: argparse takes any unambiguous prefix of a flag (SGLang's parser keeps allow_abbrev): the shortest prefix of each
#: flag read here that no other SGLang 0.5.23 flag shares (--context-bucket shares "--context-").
_SHORTEST: dict[str, str] = {"--enable-two-batch-overlap": "--enable-tw", "--context-length": "--context-l"}


def _flag_named(arg: str) -> str | None:
    name = arg.split("=", 1)[0]
    for flag, shortest in _SHORTEST.items():
        if name.startswith(shortest) and flag.startswith(name):
            return flag
    return None


def flag_values(args: list[str], flag: str) -> list[str]:
    """The values `args` gives `flag` (one of _SHORTEST's), as SGLang's parser reads them: `--flag v` or
    `--flag=v`, the flag or any unambiguous prefix of it; the last one is the one SGLang keeps."""
    out = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if _flag_named(name) != flag:
            continue
        if eq:
            out.append(value)
        elif i + 1 < len(args):
            out.append(args[i + 1])
    return out


def capture_args_problem(server: ServerConfig) -> str | None:
    """Why SGLang launched with `server.extra_args` would skip the capture of some layers, naming the key, the flag
    and the fix; None when nothing there does. An attached server (`server.url`) was launched elsewhere: its flags
    are not ours to read."""
    found = [(arg, flag) for arg in server.extra_args if (flag := _flag_named(arg)) in CAPTURE_SKIPPING_FLAGS]
    if not found:
        return None
    arg, flag = found[0]
    return (
        f"server.extra_args has {arg!r} ({flag}): {CAPTURE_SKIPPING_FLAGS[flag]}. Remove it from server.extra_args "
        "for the servers that capture (extraction, live evaluation); a server of your own that serves no EAGLE-3 "
        "draft may keep it"
    )
