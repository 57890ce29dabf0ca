"""Evaluation of a trained draft: offline acceptance with the transformers target (offline.py)."""
