"""The patches `gpufeed run` applies to torch, reporting through gpufeed's SDK.

- Iterating a torch.utils.data.DataLoader is tracked as `Job.track` would: the time blocked
  in the iterator's __next__ is data_wait, the time from a batch's return to the next call
  is compute (less any checkpoint inside it), each batch is one step. Patched on the
  iterator class, so `for b in loader`, `next(iter(loader))` and libraries' fetchers are
  all seen. A loop left with `break` reports its last step when the iterator is collected,
  or, where it never is before the program ends (a DataLoader with persistent workers keeps
  its iterator: DLIO's loop), at exit. When that step ended is not known then (the program
  went on after the loop), so its compute counts at most as long as the iterator's longest
  step; the same when a persistent iterator is reused by the next epoch.
- torch.save to a path or a real file is a checkpoint: its duration, and the bytes the file
  holds afterwards (a path) or the bytes written (a file object, by its position).
  torch.save into memory (io.BytesIO) is serialisation, not a checkpoint, and is ignored.
- torch.load from a path or a real file is a model load (`Job.load`): its duration, the
  file's bytes and device (the agent names the storage tier). Loading from memory is not.
  safetensors' safe_open likewise (load_file reads through it): from the first tensor read
  to the close. transformers' from_pretrained is one load whose bytes are those of the
  weight files the loads inside it open; loads nested in another count once, their bytes
  in the outer one's.
- torch.distributed.checkpoint.save (and save_state_dict) is a checkpoint: its duration on
  every rank, and the size of the checkpoint directory, reported by global rank 0 only
  (every rank sees the whole directory). Saves nested inside a checkpoint count once.
- torch.distributed's collectives and barriers (COLLECTIVES), and the wait() of the Work
  an async one returns, are the rank's collective_wait: the host-side time of the call.
  Collectives nested in another (barrier's own wait(), all_gather_object's all_gather)
  count once. DistributedDataParallel's gradient all-reduce runs in its C++ Reducer, not
  through these functions: its wait is timed at the end of backward (see
  _time_ddp_gradient_sync). What the host-side time means per backend: docs/jobs.md.

The SDK is gpufeed/sdk.py loaded by path: it is standard-library only, so this works in a
training environment that does not have gpufeed installed.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import sys
import threading
import time
import weakref
from types import ModuleType
from typing import Any

_job: Any = None
_job_lock = threading.Lock()
# Iterators' step clocks with a step possibly in flight, flushed at exit (weak: a collected
# iterator's own finalizer has flushed it already).
_open_steps: weakref.WeakSet[_StepState] = weakref.WeakSet()
# .depth: how many checkpoints this thread is inside; .collective: how many collectives
_local = threading.local()

# The torch.distributed functions that wait for peers: timed as collective_wait.
COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_coalesced",
    "all_gather_object",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "monitored_barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
)


def _sdk() -> ModuleType:
    mod = sys.modules.get("_gpufeed_sdk")
    if mod is not None:
        return mod
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sdk.py")
    spec = importlib.util.spec_from_file_location("_gpufeed_sdk", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"gpufeed SDK not found at {path}")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["_gpufeed_sdk"] = mod
    spec.loader.exec_module(mod)
    return mod


def job() -> Any:
    """The process's one Job, made on first use (after a fork, the child makes its own)."""
    global _job
    j = _job
    if j is not None and j._pid == os.getpid():
        return j
    with _job_lock:
        if _job is None or _job._pid != os.getpid():
            name = os.environ.get("GPUFEED_JOB_NAME") or _program_name()
            # The Job closes itself at exit (in the process that made it only), reporting
            # the process's final I/O; `_pid` is the SDK's own record of that process.
            _job = _sdk().Job(name)
            # Registered after the Job's own exit handler, so it runs before it (atexit is
            # last in, first out): the steps in flight go out with the Job's last flush.
            atexit.register(_flush_open_steps, os.getpid())
        return _job


def _flush_open_steps(pid: int) -> None:
    if pid != os.getpid():  # a forked child inherited the handler, not the steps
        return
    for st in list(_open_steps):
        st.flush_unknown_end()


def _program_name() -> str:
    argv0 = sys.argv[0] if sys.argv and sys.argv[0] else "python"
    return os.path.basename(argv0) or "python"


# -- DataLoader ---------------------------------------------------------------------------


class _StepState:
    """One DataLoader iterator's step clock; flushes its last step when the iterator goes."""

    __slots__ = ("__weakref__", "body_start", "inner0", "iter_started", "longest", "wait")

    def __init__(self, iter_started: float) -> None:
        self.iter_started: float | None = iter_started
        self.body_start: float | None = None
        self.wait = 0.0
        self.inner0 = 0.0
        self.longest = 0.0  # the longest compute of a step that ended at the next batch

    def finish_step(self, now: float, end_known: bool = True) -> None:
        body_start = self.body_start
        if body_start is None:
            return
        self.body_start = None  # once, even if the send fails
        j = job()
        compute = now - body_start - (j._inner_seconds - self.inner0)
        if end_known:
            self.longest = max(self.longest, compute)
        elif self.longest > 0.0:
            compute = min(compute, self.longest)
        j._add_step(self.wait, compute, now)

    def flush(self) -> None:
        """The iterator was collected: its step in flight ended now."""
        with contextlib.suppress(Exception):
            self.finish_step(time.perf_counter())

    def flush_unknown_end(self) -> None:
        """The step in flight ended at some point before now (exit, or the iterator reused
        by the next epoch after whatever the program did in between)."""
        with contextlib.suppress(Exception):
            self.finish_step(time.perf_counter(), end_known=False)


def _state(it: Any, now: float) -> _StepState:
    st: _StepState | None = it.__dict__.get("_gpufeed_state")
    if st is None:
        st = _StepState(now)
        it.__dict__["_gpufeed_state"] = st
        weakref.finalize(it, st.flush)
        _open_steps.add(st)
    return st


def patch_torch(torch: Any) -> None:
    # The job registers with the agent now, when the program imports torch, not at its
    # first batch: a program that loads its weights for minutes first is a job starting
    # up (0% busy), not an absent one.
    try:
        job()
    except Exception as exc:
        _warn_once(f"job not registered: {exc!r}")
    from torch.utils.data import dataloader as dl

    loader_cls = dl.DataLoader
    iter_cls = dl._BaseDataLoaderIter
    if getattr(iter_cls.__next__, "_gpufeed", False):
        return
    orig_iter = loader_cls.__iter__
    orig_next = iter_cls.__next__

    @functools.wraps(orig_iter)
    def __iter__(self: Any) -> Any:
        t0 = time.perf_counter()
        it = orig_iter(self)  # starts the workers: part of the first batch's wait
        try:
            st = _state(it, t0)
            st.flush_unknown_end()  # a reused (persistent-workers) iterator: its last step
            st.iter_started = t0
        except Exception:
            pass
        return it

    @functools.wraps(orig_next)
    def __next__(self: Any) -> Any:
        t0 = time.perf_counter()
        try:
            j = job()
            st = _state(self, t0)
            st.finish_step(t0)
            if st.iter_started is not None:
                t0, st.iter_started = min(t0, st.iter_started), None
        except Exception:
            return orig_next(self)
        try:
            batch = orig_next(self)
        except StopIteration:
            now = time.perf_counter()
            with contextlib.suppress(Exception):  # the wait for the end of the data
                if not j._report_startup():  # (an empty first loop: no first step)
                    j._add_phase(_sdk().PHASES.index("data_wait"), now - t0, now)
            raise
        now = time.perf_counter()
        # the process's first batch ends its start-up, which includes this wait (workers)
        wait = 0.0 if j._report_startup() else now - t0
        st.wait, st.body_start, st.inner0 = wait, now, j._inner_seconds
        return batch

    __next__._gpufeed = True  # type: ignore[attr-defined]
    loader_cls.__iter__ = __iter__  # type: ignore[method-assign]
    iter_cls.__next__ = __next__  # type: ignore[method-assign]

    orig_save = torch.save

    @functools.wraps(orig_save)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        target = _file_target(f)
        if target is None or _depth():
            return orig_save(obj, f, *args, **kwargs)
        pos0 = _position(f) if target == "file" else None
        with _checkpoint() as done:
            result = orig_save(obj, f, *args, **kwargs)
            if target == "file":
                pos1 = _position(f)
                done(pos1 - pos0 if pos0 is not None and pos1 is not None else -1)
            else:
                done(_path_bytes(f))
        return result

    torch.save = save
    serialization: Any = sys.modules.get("torch.serialization")
    if serialization is not None:
        serialization.save = save
    load = _timed_load(torch.load, _torch_load_path)
    if serialization is not None and getattr(serialization, "load", None) is torch.load:
        serialization.load = load
    torch.load = load
    try:
        patch_distributed(torch)
    except Exception as exc:  # an odd torch build: the rest stays instrumented
        _warn_once(f"collectives not timed: {exc!r}")


# -- model loads -------------------------------------------------------------------------------


def _timed_load(orig: Any, path_of: Any) -> Any:
    """`orig` timed as a model load of the file `path_of(args, kwargs)` names (None: not a
    load from storage: run untimed). Never raises into the load: where no Job can be made
    the load runs untimed, and the load's own errors are the program's."""
    if getattr(orig, "_gpufeed", False):
        return orig

    @functools.wraps(orig)
    def load(*args: Any, **kwargs: Any) -> Any:
        stack = contextlib.ExitStack()
        try:
            path = path_of(args, kwargs)
            if path is not _NOT_STORAGE:
                stack.enter_context(job().load(path))
        except Exception as exc:
            _warn_once(f"model loads not reported: {exc!r}")
        with stack:
            return orig(*args, **kwargs)

    load._gpufeed = True  # type: ignore[attr-defined]
    return load


_NOT_STORAGE = object()  # a load from memory (io.BytesIO): deserialisation, not a load


def _torch_load_path(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch.load(f, ...): a path, or a real file (its name, if it is one)."""
    f = args[0] if args else kwargs.get("f")
    if isinstance(f, (str, bytes, os.PathLike)):
        return f
    if _file_target(f) != "file":
        return _NOT_STORAGE
    name = getattr(f, "name", None)
    return name if isinstance(name, (str, bytes)) and os.path.exists(name) else None


def _first_arg_path(key: str) -> Any:
    def path_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        p = args[0] if args else kwargs.get(key)
        return p if isinstance(p, (str, bytes, os.PathLike)) and os.path.exists(p) else None

    return path_of


def patch_safetensors(module: ModuleType) -> None:
    """safetensors' `safe_open` (on the package, and on any module that bound it before
    this ran): every safetensors reader of a file goes through it, `load_file` and
    transformers alike, so it alone is timed and each file opened counts once."""
    orig = getattr(module, "safe_open", None)
    if orig is not None:
        module.safe_open = _timed_safe_open(orig)  # type: ignore[attr-defined]


def _timed_safe_open(orig: Any) -> Any:
    if getattr(orig, "_gpufeed", False):
        return orig

    def safe_open(filename: Any, *args: Any, **kwargs: Any) -> Any:
        return _SafeOpen(orig(filename, *args, **kwargs), filename)

    with contextlib.suppress(Exception):
        functools.update_wrapper(safe_open, orig)
    safe_open._gpufeed = True  # type: ignore[attr-defined]
    return safe_open


class _SafeOpen:
    """A `safe_open` handle whose use inside `with` is a model load of its file: from the
    first tensor read (get_tensor, get_tensors, get_slice) to the close. An open that reads only the
    header (metadata(), keys(): transformers checks the format this way) is no load, and
    a handle used without `with` is not timed (it has no end to time to)."""

    __slots__ = ("_handle", "_inside", "_path", "_stack", "_started")

    def __init__(self, handle: Any, path: Any) -> None:
        self._handle = handle
        self._path = path
        self._stack = contextlib.ExitStack()
        self._inside = False
        self._started = False

    def __enter__(self) -> Any:
        self._handle.__enter__()
        self._inside = True
        return self

    def __exit__(self, *exc: Any) -> Any:
        try:
            return self._handle.__exit__(*exc)
        finally:
            self._inside = False
            with contextlib.suppress(Exception):
                self._stack.close()

    def _begin(self) -> None:
        if self._inside and not self._started:
            self._started = True
            try:
                self._stack.enter_context(job().load(self._path))
            except Exception as exc:
                _warn_once(f"model loads not reported: {exc!r}")

    def get_tensor(self, *args: Any, **kwargs: Any) -> Any:
        self._begin()
        return self._handle.get_tensor(*args, **kwargs)

    def get_slice(self, *args: Any, **kwargs: Any) -> Any:
        self._begin()
        return self._handle.get_slice(*args, **kwargs)

    def get_tensors(self, *args: Any, **kwargs: Any) -> Any:  # load_file reads this way
        self._begin()
        return self._handle.get_tensors(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


def patch_transformers(module: ModuleType) -> None:
    """transformers.modeling_utils.PreTrainedModel.from_pretrained is a model load. Its
    bytes are those of the weight files the loads inside it open (torch.load, safe_open),
    not the model directory's: a directory holding both .bin and .safetensors copies of
    the weights, with configs and tokenizers, would count what is never read."""
    opener = getattr(module, "safe_open", None)
    if opener is not None:  # bound by `from safetensors import safe_open`
        module.safe_open = _timed_safe_open(opener)  # type: ignore[attr-defined]
    cls = getattr(module, "PreTrainedModel", None)
    method = cls.__dict__.get("from_pretrained") if cls is not None else None
    func = getattr(method, "__func__", None)
    if cls is None or func is None or getattr(func, "_gpufeed", False):
        return
    cls.from_pretrained = classmethod(_timed_load(func, lambda a, k: None))  # type: ignore[attr-defined]


def _depth() -> int:
    depth: int = getattr(_local, "depth", 0)
    return depth


def _file_target(f: Any) -> str | None:
    """'path', 'file' (a real file object) or None (memory: not a checkpoint)."""
    if isinstance(f, (str, bytes, os.PathLike)):
        return "path"
    try:
        f.fileno()
    except Exception:
        return None
    return "file"


def _position(f: Any) -> int | None:
    try:
        flush = getattr(f, "flush", None)
        if flush is not None:
            flush()
        return int(f.tell())
    except Exception:
        return None


class _checkpoint:
    """Times a checkpoint (excluding nested ones) and sends it with the bytes given to done().

    Never raises into the save: where no Job can be made (the SDK file gone, a blank
    GPUFEED_JOB_NAME), the save runs untimed."""

    def __enter__(self) -> Any:
        _local.depth = _depth() + 1
        self.nbytes = -1
        self.j: Any = None
        try:
            self.j = job()
            self.inner0 = self.j._inner_seconds
        except Exception as exc:
            _warn_once(f"checkpoints not reported: {exc!r}")
        self.t0 = time.perf_counter()

        def done(nbytes: int) -> None:
            self.nbytes = nbytes

        return done

    def __exit__(self, *exc: object) -> None:
        _local.depth -= 1
        if self.j is None:
            return
        with contextlib.suppress(Exception):
            own = max(time.perf_counter() - self.t0 - (self.j._inner_seconds - self.inner0), 0.0)
            self.j._inner_seconds += own
            self.j._emit(_sdk().KIND_CHECKPOINT, own, self.nbytes)


def _path_bytes(where: Any) -> int:
    """Bytes a checkpoint path holds (the SDK's path_bytes); -1 if that cannot be told."""
    try:
        return int(_sdk().path_bytes(os.fspath(where)))
    except Exception:
        return -1


_warned = False


def _warn_once(msg: str) -> None:
    global _warned
    if not _warned:
        _warned = True
        with contextlib.suppress(Exception):
            sys.stderr.write(f"gpufeed: {msg}\n")


# -- torch.distributed collectives -----------------------------------------------------------


def patch_distributed(torch: Any) -> None:
    """Times collectives, Work.wait() and DDP's gradient all-reduce as collective_wait."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available():
        return  # a build without distributed: nothing to time
    c10d = sys.modules.get("torch.distributed.distributed_c10d")
    for name in COLLECTIVES:
        orig = getattr(c10d, name, None) or getattr(dist, name, None)
        if orig is None or getattr(orig, "_gpufeed", False):
            continue
        timed = _timed(orig)
        for mod in (dist, c10d):
            if mod is not None and getattr(mod, name, None) is orig:
                setattr(mod, name, timed)
    work = getattr(dist, "Work", None)
    if work is not None and not getattr(work.wait, "_gpufeed", False):
        work.wait = _timed(work.wait)
    ddp = getattr(getattr(torch.nn, "parallel", None), "DistributedDataParallel", None)
    if ddp is not None and not getattr(ddp.forward, "_gpufeed", False):
        ddp.forward = _ddp_forward(ddp.forward)
    patch_device_mesh(dist)


def patch_device_mesh(dist: Any) -> None:
    """init_device_mesh with named dimensions (torchtitan's world mesh: pp, dp_replicate,
    dp_shard, cp, tp) tells the rank's parallelism coordinates: the mesh with the most
    dimensions the process made so far is reported (a sub-mesh made later tells less)."""
    mesh_mod: Any = sys.modules.get("torch.distributed.device_mesh")
    orig = getattr(mesh_mod, "init_device_mesh", None)
    if orig is None or getattr(orig, "_gpufeed", False):
        return

    @functools.wraps(orig)
    def init_device_mesh(*args: Any, **kwargs: Any) -> Any:
        mesh = orig(*args, **kwargs)
        try:
            coords = _sdk().mesh_parallel(mesh)
            j = job()
            if coords and len(coords) >= len(j.parallel):
                j.set_parallel(**coords)
        except Exception as exc:  # never into the program
            _warn_once(f"parallelism coordinates not read from the mesh: {exc!r}")
        return mesh

    init_device_mesh._gpufeed = True  # type: ignore[attr-defined]
    for mod in (mesh_mod, dist):
        if getattr(mod, "init_device_mesh", None) is orig:
            mod.init_device_mesh = init_device_mesh


def _collective_depth() -> int:
    depth: int = getattr(_local, "collective", 0)
    return depth


def _timed(orig: Any) -> Any:
    """`orig`, its host-side time added to collective_wait unless it runs inside another
    timed collective. The call itself is never touched: errors are the program's own."""

    @functools.wraps(orig)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if _collective_depth():
            return orig(*args, **kwargs)
        _local.collective = 1
        token = _collective_begin()
        try:
            return orig(*args, **kwargs)
        finally:
            _local.collective = 0
            _collective_end(token)

    timed._gpufeed = True  # type: ignore[attr-defined]
    return timed


def _collective_begin() -> object:
    """The Job's token for a collective in flight (its wait is reported as it accrues:
    a peer that never arrives shows here as a wait that grows, see sdk.Job.collective_begin);
    None where the Job cannot take it."""
    try:
        token: object = job().collective_begin()
        return token
    except Exception as exc:
        _warn_once(f"collective waits not reported: {exc!r}")
        return None


def _collective_end(token: object) -> None:
    if token is None:
        return
    try:
        job().collective_end(token)
    except Exception as exc:
        _warn_once(f"collective waits not reported: {exc!r}")


def _ddp_forward(orig: Any) -> Any:
    @functools.wraps(orig)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig(self, *args, **kwargs)
        try:
            if getattr(self, "require_backward_grad_sync", False):  # not inside no_sync()
                _time_ddp_gradient_sync(out)
        except Exception as exc:
            _warn_once(f"DDP gradient all-reduce not timed: {exc!r}")
        return out

    forward._gpufeed = True  # type: ignore[attr-defined]
    return forward


def _time_ddp_gradient_sync(out: Any) -> None:
    """Times what DDP's Reducer waits for at the end of backward: the rank's gradient
    all-reduces that have not finished when its own gradients are all computed.

    The Reducer launches each bucket's all-reduce as soon as its gradients are ready, and
    when the last bucket is ready it queues a final callback on the autograd engine that
    waits for all of them (finalize_backward). The engine runs final callbacks in the order
    they were queued, and lets a callback queue more. So: a hook on the forward's output,
    which fires at the start of backward, queues callback A (before the Reducer's, which is
    queued only at the end of the gradient computation); A reads the clock and queues B,
    which therefore runs right after the Reducer's wait; B adds the time since A."""
    tensor = _first_grad_tensor(out)
    if tensor is None:
        return
    import torch

    engine = torch.autograd.Variable._execution_engine

    def before_reducer() -> None:
        token = _collective_begin()
        engine.queue_callback(lambda: _collective_end(token))

    def on_backward(grad: Any) -> None:
        try:
            engine.queue_callback(before_reducer)
        except Exception as exc:
            _warn_once(f"DDP gradient all-reduce not timed: {exc!r}")

    tensor.register_hook(on_backward)


def _first_grad_tensor(out: Any, depth: int = 0) -> Any:
    """The first tensor in a forward's output (tensor, tuple, list, dict) that backward
    will reach; None if there is none within a few levels."""
    if getattr(out, "requires_grad", False) and hasattr(out, "register_hook"):
        return out
    if depth >= 3:
        return None
    items = out.values() if isinstance(out, dict) else out
    if isinstance(items, (tuple, list)) or isinstance(out, dict):
        for item in items:
            found = _first_grad_tensor(item, depth + 1)
            if found is not None:
                return found
    return None


# -- torch.distributed.checkpoint -------------------------------------------------------------


def patch_distributed_checkpoint(dcp: ModuleType) -> None:
    for attr in ("save", "save_state_dict"):
        orig = getattr(dcp, attr, None)
        if orig is None or getattr(orig, "_gpufeed", False):
            continue
        setattr(dcp, attr, _wrap_dcp_save(orig))


def _wrap_dcp_save(orig: Any) -> Any:
    @functools.wraps(orig)
    def save(*args: Any, **kwargs: Any) -> Any:
        if _depth():
            return orig(*args, **kwargs)
        with _checkpoint() as done:
            result = orig(*args, **kwargs)
            done(_dcp_bytes(args, kwargs))
        return result

    save._gpufeed = True  # type: ignore[attr-defined]
    return save


def _dcp_bytes(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """The checkpoint directory's size, from global rank 0; -1 elsewhere or if unknown."""
    if _global_rank() != 0:
        return -1
    where = kwargs.get("checkpoint_id")
    if where is None:
        # save(state_dict, *, storage_writer=...) or save_state_dict(state_dict, writer)
        writer = kwargs.get("storage_writer", args[1] if len(args) > 1 else None)
        where = getattr(writer, "path", None)
    return -1 if where is None else _path_bytes(where)


def _global_rank() -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:
        pass
    return 0
