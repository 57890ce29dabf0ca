"""The data end: rows in, prepared token ids out. The readers, one per kind of source (sources/:
local files, folders and globs, save_to_disk directories, Hub datasets), chat templates and loss masks (chat.py;
tool calls, results and definitions read into one form: tool_calls.py), prepare (prepare.py), the prompts stage
(prompts.py, dedup.py), synthesized replies and user turns (synthesize.py, user_turns.py), generation with the
target that both stages and the offline evaluator share (generate.py, decode_loop.py, row_sampler.py), and the
evaluation sets' prompts (eval_sets.py), which the prompts stage keeps out of the corpus.

May import: eagle3.config, eagle3.device, eagle3.progress, eagle3.store, eagle3.target, eagle3.serving
"""
