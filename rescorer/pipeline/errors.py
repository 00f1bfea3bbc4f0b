"""The rescoring pipeline's own error, in a module without torch, so that the command line can catch
it by name without loading the pipeline (``rescore-phrase-table --help`` stays instant)."""

from __future__ import annotations


class RescoreError(RuntimeError):
    """A run that cannot start or continue; the message says what to do."""
