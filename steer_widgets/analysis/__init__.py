"""Analysis over the steering layer: activations and text analysis, concept vectors,
attribution and effects ("what changed"), evaluation over prompts x strengths with its
judges and chart.

Imports ``steering``, ``sae``, ``runtime``, ``errors`` and ``checks``; never the engine
facade or widgets (the engine hands each analysis the decoder and store it needs).
"""
