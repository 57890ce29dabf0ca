"""EAGLE-3 draft-model pipeline: the Prefect-free library, one package per part of the pipeline.

    config/    the one config tree: a section per stage, YAML and `--set` overrides in
    store/     the run directory: paths, RunStore, sample and dump formats, atomic files, lock, leases, verify
    target/    the target model: a row per family (families.py), its files, the demo model, the tiny targets
    data/      rows in, prepared token ids out: sources, chat templates, prepare, prompts, synthesize
    serving/   SGLang servers: lifecycle, specs, records, keeper, generation requests, layer numbering
    extract/   one shard's extraction, the engines (SGLang, transformers), the server pool, the disk budget
    convert/   the vocabulary map and training index; peer layouts (SpecForge, speculators)
    draft/     the draft model, its data, loss, held-out split and checkpoints
    train/     the trainer, its torchrun worker and launcher, the plots
    evaluate/  offline acceptance and live serving speed
    release/   export, promotion of draft/current, the retraining plan
    checks/    before a run: `eagle3 doctor` (is this node ready?) and the pipeline's pre-flight

Beside them, the modules every part uses. What each may import of ours (tests/unit/project/test_import_rules.py
checks these lines and each package's own "May import:" line; lower lines never import higher ones):

    progress, device, versions, lifetime:  nothing
    config_merge: eagle3.config

Modules here never import Prefect, flows/ or tasks/, and SGLang only inside functions; flows/ and tasks/ wrap them
(the `eagle3` command is flows/cli.py).
"""

__version__ = "0.1.0"
