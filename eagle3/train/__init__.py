"""train: the EAGLE-3 trainer, its torchrun worker, the launcher that runs torchrun, and the plots."""
