"""Command line tools: the ``qbroker`` operator CLI and the ``qbroker-debug`` bus snooper.

Modules import the core library lazily (inside commands) so that ``--help`` stays fast.
"""
