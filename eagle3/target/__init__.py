"""The target model: everything the pipeline knows about a target model family, in one place. One row per
architecture (families.py: class name, model_type, SGLang's layer-id rule, the draft's attention, the tiny recipe),
where a target keeps its language model (layout.py: text_config, safetensors prefixes and head keys), the model
directory's facts (files.py: config facts, fingerprints, weight map, check_target), the demo model (demo.py), the
tiny random-weight targets (tiny.py), the one way a target loads in this process (load.py), and a directory
installed whole or not at all (install.py).

May import: eagle3.store
"""
