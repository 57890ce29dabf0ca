"""The EAGLE-3 draft: model (SGLang's layout), TTT loss, data over the store, held-out split, checkpoints,
warm starts, and a trained draft loaded back for evaluation.

May import: eagle3.config, eagle3.device, eagle3.progress, eagle3.store, eagle3.target, eagle3.convert
"""
