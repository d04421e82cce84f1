"""Import prebuilt provider submodules without running the provider package's root.

The root `__init__` of a prebuilt provider package (cdktn-provider-aws) imports all ~2,200
submodules (~25 s, 1.2 GB; terraform-cdk#3753). Each submodule only needs the package's
`_jsii` assembly, so we register the package as a bare namespace and import just the
submodules a stack uses (~5 s, 0.7 GB).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

from poolctl.errors import UsageError

AWS = "cdktn_provider_aws"
GOOGLE = "cdktn_provider_google"


def submodule(package: str, name: str) -> types.ModuleType:
    if package not in sys.modules:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:

            raise UsageError(
                f"{package} is not installed; run `pip install 'poolctl[synth]'` to synthesize"
            )
        pkg = types.ModuleType(package)
        pkg.__path__ = list(spec.submodule_search_locations)
        pkg.__spec__ = spec
        pkg.__package__ = package
        sys.modules[package] = pkg
    return importlib.import_module(f"{package}.{name}")


def aws(name: str) -> types.ModuleType:
    return submodule(AWS, name)


def google(name: str) -> types.ModuleType:
    return submodule(GOOGLE, name)
