"""gpufeed's zero-code instrumentation, loaded by Python at start-up (see `gpufeed run`).

`gpufeed run` puts this directory first on PYTHONPATH, so every Python process of the job
(the program, torchrun's ranks, anything a shell script starts) imports this file as its
`sitecustomize`. It does two things, both cheap and both safe in any environment:

1. runs the `sitecustomize` this one shadows, if the environment has one;
2. installs an import hook that, when (and only if) the program imports torch, patches
   DataLoader iteration, torch.save and torch.distributed.checkpoint.save to report to the
   agent (gpufeed/inject/_gpufeed_torch.py); and, when it imports botocore (boto3, s3fs),
   reports its S3 requests (gpufeed/inject/_gpufeed_botocore.py). A program that imports
   neither is untouched.

It must run in Python environments where gpufeed is not installed: it imports only the
standard library and files next to it (and gpufeed's sdk.py, one directory up, by path).
Nothing here may raise: instrumentation never breaks the program it watches.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _chain_shadowed_sitecustomize() -> None:
    """Imports the next `sitecustomize` on sys.path, the one this file hides."""
    me = sys.modules.get("sitecustomize")
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    sys.modules.pop("sitecustomize", None)
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _warn(f"the environment's sitecustomize failed: {exc!r}")
    except Exception as exc:
        _warn(f"the environment's sitecustomize failed: {exc!r}")
    finally:
        sys.path[:] = saved_path
        if me is not None:
            sys.modules["sitecustomize"] = me


def _install() -> None:
    if os.environ.get("GPUFEED_INJECT_DISABLE"):
        return
    try:
        import _gpufeed_hook  # type: ignore[import-not-found]  # next to this file

        _gpufeed_hook.install()
    except Exception as exc:
        _warn(f"instrumentation not installed: {exc!r}")


def _warn(msg: str) -> None:
    try:  # noqa: SIM105 (contextlib is not worth importing into every Python at start-up)
        sys.stderr.write(f"gpufeed: {msg}\n")
    except Exception:
        pass


_chain_shadowed_sitecustomize()
_install()
