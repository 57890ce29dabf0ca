"""Extraction: one shard's extraction (shard.py), the engines that produce hidden states (engines/: SGLang,
transformers), the servers lent to shard tasks (pool.py) and the disk budget (disk.py).

May import: eagle3.config, eagle3.device, eagle3.progress, eagle3.versions, eagle3.store, eagle3.target,
eagle3.serving
"""
