"""EAGLE-3 draft-model pipeline: the Prefect-free library.

Modules here never import Prefect or SGLang at module level; flows/ and tasks/ wrap them.
"""

__version__ = "0.1.0"
