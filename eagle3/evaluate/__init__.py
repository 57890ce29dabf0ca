"""Evaluation of a trained draft: greedy and speculative decoding (speculative.py), acceptance with the
transformers target (offline.py) and speed served by SGLang against the plain server (live.py).

May import: eagle3.config, eagle3.device, eagle3.progress, eagle3.store, eagle3.target, eagle3.serving,
eagle3.data, eagle3.extract, eagle3.draft
"""
