"""The rescoring pipeline's own error, in a module without torch, so that code which only checks a run
can raise it without loading the pipeline (``rescore-phrase-table --help`` stays instant)."""

from __future__ import annotations

from infrastructure.errors import UserError


class RescoreError(UserError):
    """A run that cannot start or continue; the message says what to do."""
