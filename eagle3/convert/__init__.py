"""Convert: what training reads (draft vocab map, training index) and the peer layouts, both ways.

    convert(cfg, store, report)            -> ConvertResult   vocab_map.safetensors + index.arrow + convert.json
    export_specforge / import_specforge     SpecForge's offline .ckpt layout (the only pickle in the project)
    export_speculators / import_speculators speculators' (vLLM's) Arrow + hs_{i}.safetensors layout
    import_speculators_draft                a speculators-trained EAGLE-3 draft -> a checkpoint directory of ours
    import_sglang_draft                     an SGLang draft directory (SpecForge's export) -> the same

Layer-index conventions and the file layouts: docs/formats.md.

May import: eagle3.config, eagle3.progress, eagle3.store, eagle3.target
"""

from eagle3.convert.common import (
    ConvertError,
    ImportResult,
    PeerExportResult,
    PeerFormatError,
    TargetModel,
    hf_to_specforge,
    hf_to_vllm,
    specforge_to_hf,
    vllm_to_hf,
)
from eagle3.convert.index import INDEX_SCHEMA, read_index
from eagle3.convert.peer_drafts import DraftImport, import_sglang_draft, import_speculators_draft
from eagle3.convert.specforge import export_specforge, import_specforge
from eagle3.convert.speculators import FinalNorm, export_speculators, import_speculators
from eagle3.convert.stage import ConvertResult, convert
from eagle3.convert.vocab import VocabMap, read_vocab_map, select_vocab

__all__ = [
    "INDEX_SCHEMA",
    "ConvertError",
    "ConvertResult",
    "DraftImport",
    "FinalNorm",
    "ImportResult",
    "PeerExportResult",
    "PeerFormatError",
    "TargetModel",
    "VocabMap",
    "convert",
    "export_specforge",
    "export_speculators",
    "hf_to_specforge",
    "hf_to_vllm",
    "import_sglang_draft",
    "import_specforge",
    "import_speculators",
    "import_speculators_draft",
    "read_index",
    "read_vocab_map",
    "select_vocab",
    "specforge_to_hf",
    "vllm_to_hf",
]
