"""Model runtimes and kernels: the bottom layer.

Owns loading a model (the shipped default, a ``.gguf``, a folder, a hub or TransformerLens
name), the fast transformer and the TransformerLens wrapper behind one ``Runtime``
protocol, the batch-invariant matrix products and the native kernel (``csrc/``), GGUF
quantized blocks, tokenization, and the cache folder. Imports nothing from steer_widgets
but ``errors`` and ``checks``.
"""
