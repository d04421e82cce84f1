"""`LazyModule`: a module imported on the first read of one of its attributes."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from poolctl.errors import UsageError


class LazyModule:
    """Stands for the module `name` until code reads an attribute of it; the import happens
    then, once. An SDK that is not installed is one line naming the extra to install
    (`missing`), not a traceback. Attributes are `Any`: the SDKs poolctl loads this way
    are typed where poolctl takes values from them."""

    def __init__(self, name: str, missing: str) -> None:
        self._name = name
        self._missing = missing
        self._module: ModuleType | None = None

    @property
    def loaded(self) -> bool:
        return self._module is not None

    def load(self) -> ModuleType:
        if self._module is None:
            try:
                self._module = importlib.import_module(self._name)
            except ImportError:
                raise UsageError(self._missing) from None
        return self._module

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.load(), attr)

    def __repr__(self) -> str:
        state = "loaded" if self._module is not None else "not loaded yet"
        return f"<LazyModule {self._name} ({state})>"
