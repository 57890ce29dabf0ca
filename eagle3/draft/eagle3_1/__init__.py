"""EAGLE-3.1 (arXiv 2605.09992): EAGLE-3 with an RMSNorm per aux state before `fc` (`fc_norm`) and the post-norm
state fed to the next step (`norm_output`), both read by SGLang 0.5.23's llama_eagle3.py from config.json. The same
model, loss and drafter as EAGLE-3 (eagle3/draft/eagle3/), built with both flags; served with --speculative-algorithm
EAGLE3.

May import: eagle3.draft
"""

from eagle3.draft.eagle3 import Eagle3Method
from eagle3.draft.eagle3.model import Eagle3Flags

METHOD = Eagle3Method("eagle3.1", Eagle3Flags(fc_norm=True, norm_output=True))
