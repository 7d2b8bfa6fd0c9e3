"""An import hook that runs a patch right after a watched module finishes importing.

Only `torch`, `torch.distributed.checkpoint`, `botocore.session`, the S3 connector's
client module, `safetensors`, `safetensors.torch` and `transformers.modeling_utils` are
watched; for every other import the hook is one dict lookup. The patch code itself (_gpufeed_torch,
_gpufeed_botocore, _gpufeed_s3torch) is imported only when the module it patches is.
Standard library only; never raises into the importing program.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any


def _patch_torch(module: ModuleType) -> None:
    import _gpufeed_torch  # type: ignore[import-not-found]  # next to this file

    _gpufeed_torch.patch_torch(module)


def _patch_dcp(module: ModuleType) -> None:
    import _gpufeed_torch  # type: ignore[import-not-found]  # next to this file

    _gpufeed_torch.patch_distributed_checkpoint(module)


def _patch_botocore(module: ModuleType) -> None:
    import _gpufeed_botocore  # type: ignore[import-not-found]  # next to this file

    _gpufeed_botocore.patch_botocore_session(module)


def _patch_s3torch(module: ModuleType) -> None:
    import _gpufeed_s3torch  # type: ignore[import-not-found]  # next to this file

    _gpufeed_s3torch.patch_s3_client(module)


def _patch_safetensors(module: ModuleType) -> None:
    import _gpufeed_torch  # type: ignore[import-not-found]  # next to this file

    _gpufeed_torch.patch_safetensors(module)


def _patch_transformers(module: ModuleType) -> None:
    import _gpufeed_torch  # type: ignore[import-not-found]  # next to this file

    _gpufeed_torch.patch_transformers(module)


WATCHED: dict[str, Callable[[ModuleType], None]] = {
    "torch": _patch_torch,
    "torch.distributed.checkpoint": _patch_dcp,
    # boto3, and aiobotocore (s3fs) whose session subclasses this one
    "botocore.session": _patch_botocore,
    # the PyTorch S3 connector: its own (Rust) client, not botocore
    "s3torchconnector._s3client._s3client": _patch_s3torch,
    # the package, before anything binds its safe_open; safetensors.torch for a package
    # imported before the hook was installed
    "safetensors": _patch_safetensors,
    "safetensors.torch": _patch_safetensors,
    "transformers.modeling_utils": _patch_transformers,
}


class _PatchingLoader(Loader):
    """Delegates to the real loader, then runs the patch on the finished module."""

    def __init__(self, inner: Loader, patch: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._patch = patch

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:
            sys.stderr.write(f"gpufeed: could not instrument {module.__name__}: {exc!r}\n")

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._inner, name)


class PatchingFinder(MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        patch = WATCHED.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _PatchingLoader(spec.loader, patch)
            return spec
        return None


def install() -> None:
    if not any(isinstance(f, PatchingFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, PatchingFinder())
