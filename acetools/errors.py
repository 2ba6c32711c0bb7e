"""The project's own error types: what the command line prints as one line of bad input.

They subclass the built-in type they replace (``except ValueError`` keeps working); anything
else that escapes is a bug and keeps its traceback (:data:`acetools.cli.USER_ERRORS`).
"""

from __future__ import annotations

__all__ = ["AcetoolsError", "InputError", "InputKeyError", "InputTypeError"]


class AcetoolsError(Exception):
    """The base of acetools' own errors."""


class InputError(AcetoolsError, ValueError):
    """A bad value: a shape, a range, a file's content, an unknown name."""


class InputKeyError(InputError, KeyError):
    """A missing or unexpected key (of a state dict, a mapping of inputs, a registry)."""

    def __str__(self) -> str:  # the message, not KeyError's repr of it
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class InputTypeError(InputError, TypeError):
    """A value of the wrong type (a mapping where a list is expected, a missing hyperparameter)."""
