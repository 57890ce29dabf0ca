"""The EAGLE-3 draft: model (SGLang's layout), TTT loss, data over the store, checkpoints."""
