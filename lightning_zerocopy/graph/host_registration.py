"""Host memory registered (pinned and mapped) for the GPU, so kernels read it in place (zero-copy, UVA).

``cudaHostRegister`` works on whole pages, and a page can belong to one registration only: registering a range
that overlaps an existing registration fails (cudaError 712), and ``cudaHostUnregister`` releases a whole
registration at once. Small tensors share pages (the CSC arrays of one ``build_csc`` call, a feature table and
its neighbor), so every registration of this process goes through one registry of page ranges
(:class:`PageRegistry`): each registered range has one owner and a reference count. Registering a tensor takes a
reference on every range that covers part of its pages and registers only the pages no range covers yet;
closing drops the references, and a range is unregistered when its count reaches zero.

Memory that something else registered or pinned (``pin_memory()``, another library) is left alone: it is not
ours to unregister. Every failed CUDA call is cleared from the thread's CUDA error state where it is handled
(``lightning_zerocopy._C.host_register``), so a later, unrelated kernel launch never reports it.

Nothing touches CUDA at import.
"""

from __future__ import annotations

import bisect
import mmap
import os
import resource
import threading
from dataclasses import dataclass, field
from typing import Optional, Protocol

import torch

__all__ = ["HostRegistration", "PageRegistry", "register_host_tensor"]

PAGE_BYTES = mmap.PAGESIZE
_CUDA_HOST_REGISTER_PORTABLE = 0x01
_CUDA_HOST_REGISTER_MAPPED = 0x02
#: cudaErrorHostMemoryAlreadyRegistered: the range overlaps a registration that is not in the registry.
CUDA_ERROR_ALREADY_REGISTERED = 712
#: Piece size tried when registering a large range in one call fails.
DEFAULT_CHUNK_BYTES = 1 << 30


class HostMemoryApi(Protocol):
    """The CUDA calls the registry makes (a fake one in the CPU tests)."""

    def register(self, address: int, nbytes: int) -> int:
        """``cudaHostRegister`` (portable, mapped); returns the cudaError code, already cleared from the thread."""

    def unregister(self, address: int) -> int:
        """``cudaHostUnregister``; returns the cudaError code, already cleared from the thread."""

    def synchronize(self) -> None:
        """Wait for every queued GPU read (before memory is unregistered)."""


class _CudaHostMemoryApi:
    """:class:`HostMemoryApi` over the extension's ``host_register``/``host_unregister`` (CUDA builds)."""

    def __init__(self) -> None:
        from lightning_zerocopy._extension import _C

        if not hasattr(_C, "host_register"):
            raise RuntimeError(
                "host memory cannot be registered for zero-copy access: lightning_zerocopy._C was built without "
                "CUDA. Rebuild it with nvcc on the PATH (`pip install --no-build-isolation -e .`)."
            )
        self._c = _C

    def register(self, address: int, nbytes: int) -> int:
        return int(self._c.host_register(address, nbytes, _CUDA_HOST_REGISTER_PORTABLE | _CUDA_HOST_REGISTER_MAPPED))

    def unregister(self, address: int) -> int:
        return int(self._c.host_unregister(address))

    def synchronize(self) -> None:
        torch.cuda.synchronize()


@dataclass
class _Range:
    """One ``cudaHostRegister`` call's pages ``[start, end)`` and how many registrations use them."""

    start: int
    end: int
    refs: int = 0


class RegistrationError(RuntimeError):
    """``cudaHostRegister`` failed with ``code`` after ``done`` of ``total`` bytes (nothing stays registered)."""

    def __init__(self, code: int, done: int, total: int) -> None:
        super().__init__(f"cudaHostRegister failed with cudaError {code} after {done} of {total} bytes")
        self.code, self.done, self.total = code, done, total


class PageRegistry:
    """Page ranges registered for the GPU, each with one owner and a reference count. Thread-safe.

    Args:
        api: the CUDA calls (default: the extension's, created on first use).
    """

    def __init__(self, api: Optional[HostMemoryApi] = None) -> None:
        self._api = api
        self._lock = threading.RLock()  # reentrant: a HostRegistration may be collected (and closed) inside a call
        self._ranges: dict[int, _Range] = {}
        self._starts: list[int] = []  # sorted keys of _ranges; the ranges never overlap
        self._pid = os.getpid()

    def acquire(self, start: int, end: int, chunk_bytes: Optional[int] = None) -> list[tuple[int, int]]:
        """Take a reference on every page range of ``[start, end)`` (page-aligned), registering uncovered pages.

        Uncovered pages are registered in one call per gap, or in pieces of ``chunk_bytes``; when one call for a
        gap larger than :data:`DEFAULT_CHUNK_BYTES` fails, the gap is retried in pieces of that size. Pages that
        something outside the registry registered (cudaError 712) are skipped: their owner keeps them.

        Returns:
            ``(start, nbytes)`` of every range referenced, in address order; pass them to :meth:`release`.

        Raises:
            RegistrationError: a registration failed; the references and pages taken by this call are released.
        """
        if start % PAGE_BYTES or end % PAGE_BYTES or end < start:
            raise ValueError(f"[{start:#x}, {end:#x}) is not a page-aligned range")
        with self._lock:
            self._forget_after_fork()
            covered = self._overlapping(start, end)
            added: list[_Range] = []
            try:
                cursor = start
                for existing in covered + [_Range(end, end)]:
                    if existing.start > cursor:
                        added += self._register_gap(cursor, existing.start, chunk_bytes, done_before=cursor - start,
                                                    total=end - start)  # fmt: skip
                    cursor = max(cursor, existing.end)
            except RegistrationError:
                self._unregister(added)
                raise
            for piece in added:
                self._ranges[piece.start] = piece
                bisect.insort(self._starts, piece.start)
            held = sorted(covered + added, key=lambda r: r.start)
            for piece in held:
                piece.refs += 1
            return [(r.start, r.end - r.start) for r in held]

    def release(self, held: list[tuple[int, int]]) -> None:
        """Drop one reference on each range of ``held``; ranges no longer used are unregistered.

        Raises:
            RuntimeError: ``cudaHostUnregister`` failed (the registry forgets the range anyway).
        """
        with self._lock:
            if self._forget_after_fork():
                return
            unused = []
            for start, _ in held:
                piece = self._ranges.get(start)
                if piece is None:
                    continue
                piece.refs -= 1
                if piece.refs <= 0:
                    unused.append(piece)
                    del self._ranges[start]
                    self._starts.remove(start)
            errors = self._unregister(unused)
        if errors:
            raise RuntimeError(f"cudaHostUnregister failed with cudaError {errors[0]} ({len(errors)} range(s))")

    def covers(self, start: int, end: int) -> bool:
        """Whether any registered range of the registry overlaps ``[start, end)``."""
        with self._lock:
            self._forget_after_fork()
            return bool(self._overlapping(start, end))

    def ranges(self) -> list[tuple[int, int, int]]:
        """``(start, nbytes, refs)`` of every registered range, in address order (for tests and diagnostics)."""
        with self._lock:
            return [(s, self._ranges[s].end - s, self._ranges[s].refs) for s in self._starts]

    # ------------------------------------------------------------------------------------------- internals

    @property
    def api(self) -> HostMemoryApi:
        if self._api is None:
            self._api = _CudaHostMemoryApi()
        return self._api

    def _forget_after_fork(self) -> bool:
        """A forked child owns no CUDA registrations: start empty there. True when it did."""
        if self._pid == os.getpid():
            return False
        self._ranges, self._starts, self._pid = {}, [], os.getpid()
        return True

    def _overlapping(self, start: int, end: int) -> list[_Range]:
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        found = []
        while i < len(self._starts) and self._starts[i] < end:
            piece = self._ranges[self._starts[i]]
            if piece.end > start:
                found.append(piece)
            i += 1
        return found

    def _register_gap(self, start: int, end: int, chunk_bytes: Optional[int], done_before: int,
                      total: int) -> list[_Range]:  # fmt: skip
        try:
            return self._register_pieces(start, end, chunk_bytes or (end - start))
        except RegistrationError as exc:
            if chunk_bytes is not None or end - start <= DEFAULT_CHUNK_BYTES:
                raise RegistrationError(exc.code, done_before + exc.done, total) from None
        try:
            return self._register_pieces(start, end, DEFAULT_CHUNK_BYTES)
        except RegistrationError as exc:
            raise RegistrationError(exc.code, done_before + exc.done, total) from None

    def _register_pieces(self, start: int, end: int, piece_bytes: int) -> list[_Range]:
        """Registers ``[start, end)`` in pieces; on failure unregisters what it did and raises."""
        added: list[_Range] = []
        address = start
        while address < end:
            size = min(piece_bytes, end - address)
            code = self.api.register(address, size)
            if code == 0:
                added.append(_Range(address, address + size))
            elif code != CUDA_ERROR_ALREADY_REGISTERED:  # 712: someone else's registration, left to them
                self._unregister(added)
                raise RegistrationError(code, address - start, end - start)
            address += size
        return added

    def _unregister(self, pieces: list[_Range]) -> list[int]:
        """Unregisters ``pieces`` after the GPU's queued reads; returns the failed calls' error codes."""
        if not pieces:
            return []
        self.api.synchronize()
        return [code for code in (self.api.unregister(p.start) for p in reversed(pieces)) if code != 0]


#: The registry of this process: every :func:`register_host_tensor` goes through it.
REGISTRY = PageRegistry()


def memlock_text() -> str:
    """The process's locked-memory limits, for pinning error messages."""
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    show = lambda v: "unlimited" if v == resource.RLIM_INFINITY else f"{v / 2**20:.0f} MiB"  # noqa: E731
    return f"locked-memory limit (`ulimit -l`): soft {show(soft)}, hard {show(hard)}"


@dataclass
class HostRegistration:
    """A tensor's pages registered for the GPU; :meth:`close` drops its references on them.

    Use as a context manager, or keep it as long as any kernel may read the memory. It keeps ``tensor`` alive,
    so the pages cannot be freed while registered.
    """

    tensor: torch.Tensor
    #: ``(address, bytes)`` of every registered page range this registration references (empty when the memory
    #: was pinned by someone else).
    chunks: list[tuple[int, int]] = field(default_factory=list)
    closed: bool = False
    registry: PageRegistry = field(default=REGISTRY, repr=False)

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self.chunks)

    def close(self) -> None:
        """Drop the references; pages no other registration uses are unregistered (after queued GPU reads).
        Idempotent."""
        if self.closed:
            return
        self.closed = True
        chunks, self.chunks = self.chunks, []
        if chunks:
            self.registry.release(chunks)

    def __enter__(self) -> "HostRegistration":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() explicitly
        try:
            self.close()
        except Exception:
            pass


#: glibc's largest mmap threshold on 64-bit: an allocation at least this large always gets a mapping of its own.
_OWN_MAPPING_BYTES = 32 << 20


def owns_its_pages(tensor: torch.Tensor) -> bool:
    """Whether the pages under ``tensor`` hold no other allocation's bytes, so registering them in place is safe.

    True when the storage is shared memory (a segment or file mapping of its own, ``is_shared()``), is at least 32
    MiB (glibc serves such an allocation from a mapping of its own), or spans every page the tensor touches (our
    page-aligned copies, views of them). A smaller heap storage shares its first and last page with other
    allocations, even one that happens to start on a page boundary (one in 64 of torch's 64-byte-aligned
    allocations does): the rest of its last page is the heap's.
    """
    storage = tensor.untyped_storage()
    if storage.is_shared() or storage.nbytes() >= _OWN_MAPPING_BYTES:
        return True
    first_page = tensor.data_ptr() // PAGE_BYTES * PAGE_BYTES
    end_page = -(-(tensor.data_ptr() + tensor.numel() * tensor.element_size()) // PAGE_BYTES) * PAGE_BYTES
    return storage.data_ptr() <= first_page and end_page <= storage.data_ptr() + storage.nbytes()


def page_aligned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of contiguous CPU ``tensor`` that starts on a page boundary of a buffer whose pages it owns."""
    nbytes = tensor.numel() * tensor.element_size()
    rounded = -(-nbytes // PAGE_BYTES) * PAGE_BYTES
    buffer = torch.empty(rounded + PAGE_BYTES, dtype=torch.uint8)
    offset = -buffer.data_ptr() % PAGE_BYTES
    copy = buffer[offset : offset + nbytes].view(tensor.dtype).view(tensor.shape)
    copy.copy_(tensor)
    return copy


def register_host_tensor(
    tensor: torch.Tensor,
    *,
    chunk_bytes: Optional[int] = None,
    name: str = "tensor",
    registry: Optional[PageRegistry] = None,
) -> HostRegistration:
    """Pin and map the memory of a CPU tensor so CUDA kernels can read it in place (zero-copy).

    The tensor's pages are registered (portable + mapped) through the process's :class:`PageRegistry`: pages
    another open registration already covers are shared with it (reference counted), the others are registered in
    one call per uncovered range, or in pieces of ``chunk_bytes``; a range larger than 1 GiB whose single call
    fails is retried in 1 GiB pieces. Kernels read across piece boundaries without trouble (the device address of
    registered memory is its host address), but one ``cudaMemcpy`` may not span two pieces. Memory pinned by
    someone else (``pin_memory()``) is left as it is.

    Args:
        tensor: contiguous CPU tensor (e.g. a shared-memory feature table or CSC array).
        chunk_bytes: register in pieces of this many bytes (a multiple of the page size); ``None`` = one piece per
            uncovered range.
        name: what to call the tensor in error messages.
        registry: the page registry (default: the process's).

    Registration works on whole pages, and a host copy (``tensor.to("cuda")``) whose bytes lie partly in a
    registered range and partly outside it (or in two ranges) fails with ``invalid argument``. So a tensor that may
    share its first or last page with other heap memory (see :func:`owns_its_pages`) is not registered in place: a
    copy of it in page-aligned memory of its own is registered instead, and ``registration.tensor`` is what GPU
    kernels must read. Shared-memory segments (what the DataModule builds) and large allocations (a feature file
    mapped by ``feature_storage: mmap``) are registered in place, with no copy.

    Returns:
        A :class:`HostRegistration`; kernels read ``registration.tensor`` (``tensor`` itself, or its page-aligned
        copy); keep it alive while kernels read the memory, then ``close()`` it.

    Raises:
        ValueError: ``tensor`` is not a contiguous CPU tensor, or ``chunk_bytes`` is not a page multiple.
        RuntimeError: CUDA is unavailable or pinning failed (the message gives the ``ulimit -l`` limit).
    """
    registry = REGISTRY if registry is None else registry
    if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
        raise ValueError(f"`{name}` must be a CPU tensor to register it for zero-copy access")
    if not tensor.is_contiguous():
        raise ValueError(f"`{name}` must be contiguous to register it for zero-copy access")
    if chunk_bytes is not None and (chunk_bytes <= 0 or chunk_bytes % PAGE_BYTES):
        raise ValueError(
            f"`chunk_bytes` must be a positive multiple of the page size {PAGE_BYTES}, got {chunk_bytes}"
        )
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return HostRegistration(tensor, registry=registry)
    if not owns_its_pages(tensor):
        tensor = page_aligned_copy(tensor)
    registration = HostRegistration(tensor, registry=registry)
    start = tensor.data_ptr() // PAGE_BYTES * PAGE_BYTES
    end = -(-(tensor.data_ptr() + nbytes) // PAGE_BYTES) * PAGE_BYTES
    if registry is REGISTRY:
        if not torch.cuda.is_available():
            raise RuntimeError(f"cannot register `{name}` for zero-copy access: no CUDA device is available")
        torch.cuda.init()
        if not registry.covers(start, end) and tensor.is_pinned():
            return registration  # pinned by its owner (pin_memory(), another library): not ours
    try:
        registration.chunks = registry.acquire(start, end, chunk_bytes)
    except RegistrationError as exc:
        raise RuntimeError(
            f"cudaHostRegister of `{name}` failed with cudaError {exc.code} after {exc.done / 2**30:.2f} of "
            f"{exc.total / 2**30:.2f} GiB; pinning host memory needs the {memlock_text()}. Raise it "
            "(`ulimit -l unlimited`, or memlock in /etc/security/limits.conf / the container's "
            "--ulimit memlock=-1) or register a smaller table."
        ) from None
    return registration
