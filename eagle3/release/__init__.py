"""Release: the servable draft directory (export.py), `draft/current` and its promotion (promote.py), and the
retraining plan on grown data (retrain.py).

May import: eagle3.config, eagle3.progress, eagle3.store, eagle3.target, eagle3.serving, eagle3.convert,
eagle3.draft, eagle3.train
"""
