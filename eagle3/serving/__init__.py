"""The serving end: one SGLang server's lifecycle (server.py), the servers of a run (specs.py), the record a
launched server leaves and the keeper that ends it with its owner (record.py, keeper.py, procs.py), generation
requests (generation.py), and layer numbering: which HF hidden_states indices to capture (aux_layers.py) and
how SGLang's model families number them (layers.py). Knows nothing of what the data or the draft are.

May import: eagle3.config, eagle3.device, eagle3.lifetime, eagle3.store, eagle3.target
"""
