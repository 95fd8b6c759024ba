"""The TopOSM contract and the code every TopOSM program shares (docs/architecture.md).

What the programs agree on, written once: names and command words (``contract``), the message models that
senders build and receivers validate (``messages``), one tile math (``tilemath``), the render log's one
schema (``render_log``), the tile store and its freshness markers, both expiry wires, the roles, the error
messages and the ``--metrics-port`` labels. The programs (``services.tiles.queuemaster``, ``...renderer``,
``...render_list``, ``services.web``, ``services.spark_bridge``, ``services.replicate``) import this package,
never each other; nothing here imports a program.
"""
