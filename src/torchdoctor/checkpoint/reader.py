"""Reading a checkpoint's structure without running any of its code and without loading tensors.

A file written by torch.save is a pickle: loading it normally imports and calls whatever
globals it names, so a checkpoint can run arbitrary code. Here the pickle is read by an
unpickler whose `find_class` never imports anything: every global becomes an inert stand-in
class named after it, and only a few rebuild functions (tensors, parameters, OrderedDict) are
given behaviour, which records the tensor's dtype, shape, device and storage instead of building
it. Storages are never read: their sizes come from the zip's entries (or dtype x count in the
legacy format), their devices from the location tags the pickle holds (`cuda:0`, `cpu`), so a
checkpoint saved on a GPU is described on a machine without one.

Formats: the zip format of torch.save (PyTorch >= 1.6), the legacy format (a stream of
pickles), and safetensors (a JSON header: no pickle at all). Anything else is refused with what
it appears to be (an HTML page, a Git LFS pointer, a truncated zip, ...).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import json
import pickle
import struct
import zipfile
from pathlib import Path
from typing import Any

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
MAX_GLOBALS = 10_000

# Storage classes of torch.save -> dtype name; the dtype's element size in bytes.
STORAGE_DTYPES = {
    "DoubleStorage": "float64",
    "FloatStorage": "float32",
    "HalfStorage": "float16",
    "BFloat16Storage": "bfloat16",
    "LongStorage": "int64",
    "IntStorage": "int32",
    "ShortStorage": "int16",
    "CharStorage": "int8",
    "ByteStorage": "uint8",
    "BoolStorage": "bool",
    "ComplexDoubleStorage": "complex128",
    "ComplexFloatStorage": "complex64",
    "QInt8Storage": "qint8",
    "QInt32Storage": "qint32",
    "QUInt8Storage": "quint8",
    "QUInt4x2Storage": "quint4x2",
    "QUInt2x4Storage": "quint2x4",
    "UntypedStorage": "uint8",
}
ITEM_SIZE = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex128": 16,
    "complex64": 8,
    "complex32": 4,
    "qint8": 1,
    "qint32": 4,
    "quint8": 1,
    "quint4x2": 1,
    "quint2x4": 1,
    "uint16": 2,
    "uint32": 4,
    "uint64": 8,
    "float8_e5m2": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2fnuz": 1,
    "float8_e4m3fnuz": 1,
    "float8_e8m0fnu": 1,
}
# safetensors' dtype codes.
SAFETENSORS_DTYPES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
    "BOOL": "bool",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
}


class CheckpointError(Exception):
    """The file cannot be read as a checkpoint; the message says what it is instead."""


class NotACheckpoint(CheckpointError):
    pass


class Corrupt(CheckpointError):
    pass


# --- what the pickle holds, as inert data ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Storage:
    key: str
    dtype: str
    device: str
    nbytes: int | None


@dataclasses.dataclass(eq=False)
class TensorRef:
    """A tensor as the checkpoint describes it; its data is never read here."""

    dtype: str
    shape: tuple[int, ...]
    device: str
    storage: Storage | None
    offset: int = 0
    stride: tuple[int, ...] = ()
    requires_grad: bool = False
    parameter: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEM_SIZE.get(self.dtype, 1)


class Stand:
    """Base of the stand-in classes: an object of a class the pickle names, never imported.
    It keeps what the pickle gives it: constructor arguments and state."""

    _qualname = "?"

    def __new__(cls, *args: Any, **kwargs: Any) -> Stand:
        obj = super().__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:  # dict-like subclasses (SETITEMS)
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: Any) -> None:  # list-like subclasses (APPENDS)
        self.__dict__.setdefault("items_list", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("items_list", []).extend(values)

    @classmethod
    def qualname(cls) -> str:
        return cls._qualname

    args: tuple[Any, ...]
    state: Any


def is_stand(value: Any) -> bool:
    return isinstance(value, Stand) or (isinstance(value, type) and issubclass(value, Stand))


def qualname_of(value: Any) -> str:
    cls = value if isinstance(value, type) else type(value)
    return cls.qualname() if issubclass(cls, Stand) else f"{cls.__module__}.{cls.__qualname__}"


def _dtype_name(value: Any) -> str:
    """A dtype given as a global (`torch.float32`) or a storage class (`torch.FloatStorage`)."""
    name = qualname_of(value).rsplit(".", 1)[-1]
    return STORAGE_DTYPES.get(name, name)


def _rebuild_tensor(
    storage: Any, offset: int, size: Any, stride: Any, requires_grad: bool = False, *rest: Any
) -> TensorRef:
    dtype = storage.dtype if isinstance(storage, Storage) else "?"
    device = storage.device if isinstance(storage, Storage) else "?"
    return TensorRef(
        dtype,
        tuple(int(d) for d in size),
        device,
        storage if isinstance(storage, Storage) else None,
        int(offset),
        tuple(int(s) for s in stride),
        bool(requires_grad),
    )


def _rebuild_tensor_v3(
    storage: Any,
    offset: int,
    size: Any,
    stride: Any,
    requires_grad: bool,
    hooks: Any,
    dtype: Any,
    *rest: Any,
) -> TensorRef:
    t = _rebuild_tensor(storage, offset, size, stride, requires_grad)
    t.dtype = _dtype_name(dtype)
    return t


def _rebuild_parameter(data: Any, requires_grad: bool = True, *rest: Any) -> Any:
    if isinstance(data, TensorRef):
        data.parameter = True
        data.requires_grad = bool(requires_grad)
    return data


def _rebuild_meta(dtype: Any, size: Any, stride: Any, requires_grad: bool = False) -> TensorRef:
    return TensorRef(_dtype_name(dtype), tuple(int(d) for d in size), "meta", None)


def _rebuild_from_type(func: Any, new_type: Any, args: Any, state: Any = None) -> Any:
    """A tensor subclass (nn.Parameter, ...): the tensor from one of the rebuilds above."""
    if func in _REBUILDS and isinstance(args, tuple):
        tensor = func(*args)
        if isinstance(tensor, TensorRef) and qualname_of(new_type).endswith("Parameter"):
            tensor.parameter = True
        return tensor
    return _stand_in("torch._tensor", "_rebuild_from_type_v2")(func, new_type, args, state)


def _size(values: Any = ()) -> tuple[Any, ...]:
    return tuple(values) if isinstance(values, (list, tuple)) else ()


_REBUILDS = (_rebuild_tensor, _rebuild_tensor_v3, _rebuild_parameter, _rebuild_meta)

# The only globals given behaviour; each builds inert data (no import, no call into the file).
_KNOWN: dict[str, Any] = {
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "torch.Size": _size,
    "collections.OrderedDict": collections.OrderedDict,
    "torch._utils._rebuild_tensor_v2": _rebuild_tensor,
    "torch._utils._rebuild_tensor": _rebuild_tensor,
    "torch._utils._rebuild_tensor_v3": _rebuild_tensor_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
    "torch._utils._rebuild_meta_tensor_no_storage": _rebuild_meta,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "__builtin__.set": set,
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: io.BufferedIOBase | io.BytesIO, storage: Any) -> None:
        super().__init__(data, encoding="utf-8")
        self._storage = storage
        self.globals: list[str] = []
        self._classes: dict[str, type] = {}

    def find_class(self, module: str, name: str) -> Any:
        qual = f"{module}.{name}"
        if qual not in self._classes:
            if len(self._classes) >= MAX_GLOBALS:
                raise Corrupt(f"the pickle names more than {MAX_GLOBALS} globals")
            self.globals.append(qual)
            known = _KNOWN.get(qual)
            self._classes[qual] = known if known is not None else _stand_in(module, name)
        return self._classes[qual]

    def persistent_load(self, pid: Any) -> Any:
        return self._storage(pid)


def _stand_in(module: str, name: str) -> type:
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in name)[:100] or "_"
    return type(safe, (Stand,), {"_qualname": f"{module}.{name}", "__module__": "stand_in"})


# --- the file ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Checkpoint:
    """What reading the file found: its format, the object tree (tensors as TensorRef,
    objects of other classes as stand-ins), the storages and the globals the pickle names."""

    path: Path
    format: str  # "zip", "legacy" or "safetensors"
    size: int
    root: Any
    storages: dict[str, Storage]
    globals: list[str]
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


def _sniff(head: bytes, path: Path) -> str:
    """What a file that is not a checkpoint looks like."""
    text = head.lstrip()[:200]
    if not head:
        return "the file is empty (an interrupted save or download?)"
    if text.startswith(b"version https://git-lfs"):
        return "a Git LFS pointer, not the file itself: run `git lfs pull` to fetch it"
    if text[:15].lower().startswith((b"<!doctype html", b"<html")):
        return "an HTML page (a download that saved an error or login page instead of the file)"
    if head.startswith(b"\x89HDF"):
        return "an HDF5 file (Keras/TensorFlow weights?), not a PyTorch checkpoint"
    if head.startswith(b"GGUF"):
        return "a GGUF file (llama.cpp), not a PyTorch checkpoint"
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy .npy array, not a PyTorch checkpoint"
    if path.suffix in (".py", ".txt", ".json", ".yaml", ".yml") or _is_text(head):
        return "a text file, not a checkpoint"
    return "not a checkpoint: neither torch.save's zip nor legacy format, nor safetensors"


def _is_text(head: bytes) -> bool:
    try:
        head[:512].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in head[:512]


def read(path: str | Path) -> Checkpoint:
    """Read `path`'s structure. Raises FileNotFoundError/IsADirectoryError/PermissionError for
    the file itself, NotACheckpoint or Corrupt for its content."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(16)
    size = path.stat().st_size
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return _read_zip(path, size)
    if _looks_like_safetensors(head, size):
        return _read_safetensors(path, size)
    if head[:1] == b"\x80":  # a pickle's PROTO opcode: the legacy format starts with one
        return _read_legacy(path, size)
    raise NotACheckpoint(_sniff(_read_head(path), path))


def _read_head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4096)


def _storage_from(pid: Any, sizes: dict[str, int] | None) -> Storage:
    if not isinstance(pid, tuple) or not pid or pid[0] != "storage" or len(pid) < 5:
        raise Corrupt(f"unexpected persistent id in the pickle: {str(pid)[:100]}")
    _tag, storage_type, key, location, numel = pid[:5]
    dtype = _dtype_name(storage_type)
    nbytes = sizes.get(str(key)) if sizes is not None else None
    if nbytes is None and isinstance(numel, int):
        nbytes = numel * ITEM_SIZE.get(dtype, 1)
    return Storage(str(key), dtype, str(location), nbytes)


def _read_zip(path: Path, size: int) -> Checkpoint:
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile:
        raise Corrupt(
            "a zip file whose end is missing or damaged: the save or the download was cut "
            "short (torch.save's zip format keeps its index at the end of the file)"
        ) from None
    with archive:
        names = archive.namelist()
        pkl = [n for n in names if n.endswith("data.pkl") and n.count("/") == 1]
        if not pkl:
            raise NotACheckpoint(
                "a zip file without data.pkl: not written by torch.save "
                f"(it holds {', '.join(names[:5])}{'...' if len(names) > 5 else ''})"
            )
        prefix = pkl[0].rsplit("/", 1)[0]
        sizes: dict[str, int] = {}
        for info in archive.infolist():
            head, _, key = info.filename.partition(f"{prefix}/data/")
            if not head and key:
                sizes[key] = info.file_size
        try:
            data = archive.read(pkl[0])
            meta = {"archive": prefix}
            for name in ("version", ".format_version", "byteorder"):
                if f"{prefix}/{name}" in names:
                    meta[name.lstrip(".")] = archive.read(f"{prefix}/{name}").decode().strip()
        except (zipfile.BadZipFile, OSError, EOFError, UnicodeDecodeError) as exc:
            raise Corrupt(f"a damaged zip entry: {exc}") from None
    root, globals_ = _unpickle(io.BytesIO(data), lambda pid: _storage_from(pid, sizes))
    storages = _collect_storages(root)
    return Checkpoint(path, "zip", size, root, storages, globals_, meta)


def _unpickle(stream: Any, storage: Any) -> tuple[Any, list[str]]:
    unpickler = _Unpickler(stream, storage)
    try:
        root = unpickler.load()
    except CheckpointError:
        raise
    except (pickle.UnpicklingError, EOFError) as exc:
        raise Corrupt(f"the pickle is damaged or cut short: {exc}") from None
    except (TypeError, ValueError, AttributeError, IndexError, KeyError, RecursionError) as exc:
        raise Corrupt(f"the pickle could not be read: {type(exc).__name__}: {exc}") from None
    return root, unpickler.globals


def _read_legacy(path: Path, size: int) -> Checkpoint:
    with open(path, "rb") as f:
        try:
            magic, _ = _unpickle(f, lambda pid: None)
        except Corrupt:
            raise NotACheckpoint(
                "a pickle that is not a torch.save checkpoint (written by pickle.dump?)"
            ) from None
        if magic != LEGACY_MAGIC:
            raise NotACheckpoint(
                "a plain pickle (written by pickle.dump?), not torch.save's format: "
                "torchdoctor does not read general pickles"
            )
        protocol, _ = _unpickle(f, lambda pid: None)
        sys_info, _ = _unpickle(f, lambda pid: None)
        root, globals_ = _unpickle(f, lambda pid: _storage_from(pid, None))
    storages = _collect_storages(root)
    meta: dict[str, Any] = {"protocol": protocol}
    if isinstance(sys_info, dict):
        meta["little_endian"] = sys_info.get("little_endian")
    return Checkpoint(path, "legacy", size, root, storages, globals_, meta)


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 2 <= n <= size - 8 and head[8:9] == b"{"


def _read_safetensors(path: Path, size: int) -> Checkpoint:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
    try:
        header = json.loads(raw)
    except ValueError as exc:
        raise Corrupt(f"a safetensors header that is not valid JSON: {exc}") from None
    if not isinstance(header, dict):
        raise Corrupt("a safetensors header that is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    root: dict[str, Any] = {}
    storages: dict[str, Storage] = {}
    end = 0
    for name, info in header.items():
        try:
            dtype = SAFETENSORS_DTYPES.get(info["dtype"], info["dtype"].lower())
            shape = tuple(int(d) for d in info["shape"])
            start, stop = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise Corrupt(f"a safetensors entry that cannot be read: {name!r}") from None
        storage = Storage(name, dtype, "(not recorded)", stop - start)
        storages[name] = storage
        root[name] = TensorRef(dtype, shape, storage.device, storage, start)
        end = max(end, stop)
    if 8 + n + end > size:
        raise Corrupt(
            f"a safetensors file cut short: its header promises {8 + n + end:,} bytes, the "
            f"file has {size:,}"
        )
    return Checkpoint(path, "safetensors", size, root, storages, [], {"metadata": meta})


def _collect_storages(root: Any) -> dict[str, Storage]:
    out: dict[str, Storage] = {}
    for _path, tensor in iter_tensors(root):
        if tensor.storage is not None:
            out.setdefault(tensor.storage.key, tensor.storage)
    return out


# --- walking the tree --------------------------------------------------------------------------


def children(value: Any) -> list[tuple[str, Any]]:
    """The named parts of a container or of a stand-in object (its state and items)."""
    if isinstance(value, dict):
        return [(str(k), v) for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [(str(i), v) for i, v in enumerate(value)]
    if isinstance(value, Stand):
        out: list[tuple[str, Any]] = []
        state = value.state
        if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict):
            state = {**(state[0] or {}), **state[1]} if isinstance(state[0], dict) else state[1]
        if isinstance(state, dict):
            out += [(str(k), v) for k, v in state.items()]
        elif state is not None:
            out.append(("state", state))
        items = value.__dict__.get("items")
        if isinstance(items, dict):
            out += [(str(k), v) for k, v in items.items()]
        out += [(str(i), v) for i, v in enumerate(value.__dict__.get("items_list", []))]
        out += [(f"arg{i}", v) for i, v in enumerate(value.args) if _interesting(v)]
        return out
    return []


def _interesting(value: Any) -> bool:
    return isinstance(value, (dict, list, tuple, TensorRef, Stand))


def iter_tensors(root: Any, prefix: str = "") -> Any:
    """(path, TensorRef) for every tensor in the tree, each object visited once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(prefix, root)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, TensorRef):
            yield path, value
            continue
        if id(value) in seen or not (isinstance(value, (dict, list, tuple, Stand))):
            continue
        seen.add(id(value))
        for name, child in reversed(children(value)):
            stack.append((f"{path}.{name}" if path else name, child))
