"""The warning a deprecated module gives when it is imported: where its names live now."""

from __future__ import annotations

import warnings


def warn_moved_module(old: str, new: str) -> None:
    """Warns (DeprecationWarning) that module `old` is kept for one release and `new` is the home
    of its names. Call it at the top level of `old`."""
    # stacklevel 3 is the module importing `old` (`warnings` skips the import machinery's frames),
    # so the warning names the user's import line and Python's default filters show it from __main__.
    warnings.warn(
        f"{old} is deprecated and will be removed in the next release; import its names from {new}.",
        DeprecationWarning,
        stacklevel=3,
    )
