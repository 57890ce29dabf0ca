"""The short conversations of the shared demo store (conftest.py demo_store) and the small training settings its
tests train with; test_grow_fp8_retrain.py builds its own store from the same facts."""

FACTS = ["Paris is the capital of France.", "Bees make honey.", "Three times four is twelve.",
         "Hola means hello in Spanish.", "The sky is blue.", "A cat sat on a mat."]  # fmt: skip
TRAIN = {"batch_tokens": 256, "ttt_steps": 2, "warmup_steps": 2, "draft_vocab_size": 512, "precision": "fp32",
         "log_every": 1, "checkpoint_every": 100, "loader_threads": 1, "prefetch_batches": 2}  # fmt: skip
