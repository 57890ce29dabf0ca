"""Evaluation of a trained draft: the decode loops (decode.py), acceptance with the transformers target
(offline.py) and speed served by SGLang against the plain server (live.py)."""
