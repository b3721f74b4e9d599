"""The former Llama-only runtime's names, kept so existing imports keep working.

The fast runtime is now one configurable transformer for every supported architecture:
see ``transformer.py`` (and ``runtime.py`` for the interface and hook names).
"""

from .runtime import HOOK_KINDS, Hook
from .transformer import KVCache, place_layers
from .transformer import Transformer as Llama
from .transformer import TransformerConfig as LlamaConfig

__all__ = ["HOOK_KINDS", "Hook", "KVCache", "Llama", "LlamaConfig", "place_layers"]
