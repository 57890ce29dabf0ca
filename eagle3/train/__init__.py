"""train: the EAGLE-3 trainer, its torchrun worker, the launcher that runs torchrun, and the plots.
torchrun runs it bare: never Prefect.

May import: eagle3.config, eagle3.device, eagle3.lifetime, eagle3.progress, eagle3.store, eagle3.draft
"""
