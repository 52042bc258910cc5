"""The warning a deprecated module gives when it is imported: where its names live now."""

from __future__ import annotations

import sys
import warnings


def _forwards_the_import(frame) -> bool:
    """A frame between the importing line and the deprecated module: the import machinery, or
    the package's `__getattr__` that imports a deprecated submodule on attribute access."""
    return "importlib" in frame.f_code.co_filename or frame.f_globals.get("__name__") == "keras_thermo"


def warn_moved_module(old: str, new: str) -> None:
    """Warns (DeprecationWarning) that module `old` is kept for one release and `new` is the home
    of its names. Call it at the top level of `old`.

    The warning names the line that imported `old` (`import`, `from ... import`, or an attribute
    such as `keras_thermo.models`), so Python's default filters show it when that line is in
    `__main__`, and pytest reports it where it arises.
    """
    message = f"{old} is deprecated and will be removed in the next release; import its names from {new}."
    frame = sys._getframe(2)  # 0: here, 1: module `old`, 2: what imports it
    while frame is not None and _forwards_the_import(frame):
        frame = frame.f_back
    if frame is None:
        warnings.warn(message, DeprecationWarning, stacklevel=2)
        return
    module_globals = frame.f_globals
    warnings.warn_explicit(
        message,
        DeprecationWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__", "<unknown>"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )
