"""train: the EAGLE-3 trainer (trainer), its torchrun worker (worker), the launcher that runs it (launch), and its plots (plot)."""
