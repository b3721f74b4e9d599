"""The remote engine: the ``Engine`` API over an interp-engine server (``engine.py``) and
the HTTP client that speaks to it (``client.py``). Beside the engine facade: it subclasses
``Engine`` and imports everything below it, nothing imports it but ``steer_widgets``.
"""
