"""The page-range registry behind ``register_host_tensor``, against a fake CUDA that enforces cudaHostRegister's rules:
a page belongs to at most one registration (an overlapping call fails with 712) and ``cudaHostUnregister`` takes
the base address of a whole registration. Runs on the CPU (no GPU needed)."""

from __future__ import annotations

import random
import threading

import pytest
import torch

from tests.helpers import exclusive_host_copy, heap_tensor, page_aligned_heap_bytes

from lightning_zerocopy.graph.host_registration import (
    CUDA_ERROR_ALREADY_REGISTERED,
    DEFAULT_CHUNK_BYTES,
    PAGE_BYTES,
    PageRegistry,
    owns_its_pages,
    register_host_tensor,
)

P = PAGE_BYTES
CUDA_ERROR_NOT_REGISTERED = 713
CUDA_ERROR_OUT_OF_MEMORY = 2


class FakeCuda:
    """Registrations as (start, end) pairs, with the runtime's overlap and base-address rules."""

    def __init__(self, fail_above: int | None = None, fail_code: int = CUDA_ERROR_OUT_OF_MEMORY) -> None:
        self.ranges: dict[int, int] = {}
        self.fail_above = fail_above  # calls registering more bytes than this fail with fail_code
        self.fail_code = fail_code
        self.fail_at_call: int | None = None
        self.calls = 0
        self.syncs = 0
        self.lock = threading.Lock()

    def register(self, address: int, nbytes: int) -> int:
        with self.lock:
            self.calls += 1
            assert address % P == 0 and nbytes % P == 0 and nbytes > 0
            if self.fail_at_call == self.calls or (self.fail_above is not None and nbytes > self.fail_above):
                return self.fail_code
            end = address + nbytes
            if any(s < end and address < e for s, e in self.ranges.items()):
                return CUDA_ERROR_ALREADY_REGISTERED
            self.ranges[address] = end
            return 0

    def unregister(self, address: int) -> int:
        with self.lock:
            return 0 if self.ranges.pop(address, None) is not None else CUDA_ERROR_NOT_REGISTERED

    def synchronize(self) -> None:
        self.syncs += 1

    def covered(self, start: int, end: int) -> bool:
        """Every page of [start, end) is in some registration."""
        with self.lock:  # other threads register and unregister meanwhile
            ranges = list(self.ranges.items())
        pages = set()
        for s, e in ranges:
            pages.update(range(max(s, start), min(e, end), P))
        return all(p in pages for p in range(start, end, P))


def test_tensors_sharing_pages_keep_their_pages_until_the_last_one_closes() -> None:
    fake = FakeCuda()
    registry = PageRegistry(fake)
    base = 1000 * P
    rng = random.Random(0)
    for trial in range(30):
        # Byte ranges of small "tensors" packed back to back, several per page, some spanning page boundaries.
        spans, address = [], base + rng.randrange(0, P, 8)
        for _ in range(rng.randint(2, 40)):
            size = rng.choice([8, 200, P // 3, P, 3 * P + 24])
            spans.append((address, address + size))
            address += size + rng.choice([0, 0, 8, P])
        pages = [(s // P * P, -(-e // P) * P) for s, e in spans]
        order = list(range(len(spans)))
        rng.shuffle(order)
        held = {}
        for i in order:
            held[i] = registry.acquire(*pages[i], chunk_bytes=rng.choice([None, P, 2 * P]))
            assert fake.covered(*pages[i])
        rng.shuffle(order)
        for n, i in enumerate(order):
            registry.release(held.pop(i))
            for j in held:  # every tensor still open can still be read
                assert fake.covered(*pages[j]), (trial, n, j)
            for start, nbytes, refs in registry.ranges():
                assert refs > 0 and fake.ranges.get(start) == start + nbytes
        assert registry.ranges() == [] and fake.ranges == {}, trial


def test_overlapping_tensor_registers_only_uncovered_pages() -> None:
    fake = FakeCuda()
    registry = PageRegistry(fake)
    first = registry.acquire(10 * P, 14 * P)
    second = registry.acquire(12 * P, 18 * P)  # pages 12-13 shared, 14-17 new
    assert first == [(10 * P, 4 * P)]
    assert second == [(10 * P, 4 * P), (14 * P, 4 * P)]
    assert registry.ranges() == [(10 * P, 4 * P, 2), (14 * P, 4 * P, 1)]
    third = registry.acquire(8 * P, 20 * P)  # fills the gaps on both sides
    assert [s for s, _ in third] == [8 * P, 10 * P, 14 * P, 18 * P]
    registry.release(first)
    assert fake.covered(8 * P, 20 * P)
    registry.release(third)
    assert registry.ranges() == [(10 * P, 4 * P, 1), (14 * P, 4 * P, 1)] and fake.covered(12 * P, 18 * P)
    registry.release(second)
    assert fake.ranges == {}


def test_foreign_registrations_are_skipped_and_left_to_their_owner() -> None:
    fake = FakeCuda()
    assert fake.register(4 * P, 2 * P) == 0  # registered by someone else
    registry = PageRegistry(fake)
    held = registry.acquire(4 * P, 6 * P)
    assert held == [] and fake.ranges == {4 * P: 6 * P}
    held = registry.acquire(6 * P, 9 * P, chunk_bytes=P)
    registry.release(held)
    assert fake.ranges == {4 * P: 6 * P}


def test_a_failed_registration_leaves_nothing_behind() -> None:
    fake = FakeCuda()
    registry = PageRegistry(fake)
    kept = registry.acquire(0, 2 * P)
    fake.fail_at_call = fake.calls + 3
    with pytest.raises(RuntimeError, match="cudaError 2") as info:
        registry.acquire(P, 8 * P, chunk_bytes=P)  # page 1 shared; pages 2, 3 register, page 4 fails
    assert info.value.done == 3 * P and info.value.total == 7 * P
    assert registry.ranges() == [(0, 2 * P, 1)] and fake.ranges == {0: 2 * P}
    registry.release(kept)
    assert fake.ranges == {}


def test_large_ranges_fall_back_to_1_gib_pieces() -> None:
    fake = FakeCuda(fail_above=DEFAULT_CHUNK_BYTES)
    registry = PageRegistry(fake)
    held = registry.acquire(0, 2 * DEFAULT_CHUNK_BYTES + P)
    assert [n for _, n in held] == [DEFAULT_CHUNK_BYTES, DEFAULT_CHUNK_BYTES, P]
    registry.release(held)
    assert fake.ranges == {}
    small_fails = PageRegistry(FakeCuda(fail_above=P))
    with pytest.raises(RuntimeError, match="cudaError 2"):
        small_fails.acquire(0, 2 * P)  # no fallback below 1 GiB
    assert small_fails.ranges() == []


def test_unregistering_waits_for_the_gpu_once_per_release() -> None:
    fake = FakeCuda()
    registry = PageRegistry(fake)
    a, b = registry.acquire(0, 4 * P, chunk_bytes=P), registry.acquire(0, 4 * P)
    registry.release(a)
    assert fake.syncs == 0  # still referenced: nothing unregistered, no wait
    registry.release(b)
    assert fake.syncs == 1 and fake.ranges == {}


def test_concurrent_registrations() -> None:
    fake = FakeCuda()
    registry = PageRegistry(fake)
    errors = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                start = rng.randrange(0, 64) * P
                held = registry.acquire(start, start + rng.randint(1, 8) * P)
                assert fake.covered(start, start + P)
                registry.release(held)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and registry.ranges() == [] and fake.ranges == {}


def test_register_host_tensor_shares_pages_of_real_tensors() -> None:
    fake = FakeCuda()
    registry = PageRegistry(fake)
    storage = exclusive_host_copy(torch.zeros(4 * P, dtype=torch.uint8))  # a mapping of its own, as shared memory
    parts = [storage[i : i + 100] for i in range(0, 4 * P - 100, 700)]  # many tensors, several per page
    regs = [register_host_tensor(t, name=f"part{i}", registry=registry) for i, t in enumerate(parts)]
    for i in (3, 0, 5, 1):
        regs[i].close()
        regs[i].close()  # idempotent
        for j, t in enumerate(parts):
            if not regs[j].closed:
                assert fake.covered(t.data_ptr() // P * P, -(-(t.data_ptr() + 100) // P) * P)
    for r in regs:
        r.close()
    assert fake.ranges == {} and registry.ranges() == []
    assert register_host_tensor(torch.empty(0), registry=registry).chunks == []
    with pytest.raises(ValueError, match="`x` must be contiguous"):
        register_host_tensor(torch.zeros(4, 4).t(), name="x", registry=registry)
    with pytest.raises(ValueError, match="page size"):
        register_host_tensor(storage, chunk_bytes=P + 1, registry=registry)
    with pytest.raises(ValueError, match="page-aligned"):
        registry.acquire(1, P)


def test_a_small_heap_tensor_is_registered_as_a_page_aligned_copy() -> None:
    """A heap tensor may share its first and last page with other tensors, and a host copy of theirs that spans a
    registered and an unregistered page fails (seen on an H200: `ids.to("cuda")` next to a registered table raised
    'invalid argument'). So its own page-aligned copy is registered, and the original's pages are left alone."""
    fake = FakeCuda()
    registry = PageRegistry(fake)
    keep = [torch.arange(1000, dtype=torch.int64) for _ in range(4)]  # 8000-byte heap storages, 64-byte aligned
    heap = next(t for t in keep if t.data_ptr() % P)[1:]  # one that does not start a page (each does with p=1/64)
    assert not owns_its_pages(heap)
    registration = register_host_tensor(heap, name="heap", registry=registry)
    copy = registration.tensor
    assert copy.data_ptr() % P == 0 and copy.data_ptr() != heap.data_ptr() and torch.equal(copy, heap)
    assert fake.covered(copy.data_ptr(), copy.data_ptr() + P * 2)
    assert not fake.covered(heap.data_ptr() // P * P, heap.data_ptr() // P * P + P)
    registration.close()
    assert fake.ranges == {} and registry.ranges() == []
    mapped = exclusive_host_copy(torch.arange(1000, dtype=torch.int64))
    assert owns_its_pages(mapped) and owns_its_pages(mapped[3:])
    with register_host_tensor(mapped[3:], registry=registry) as in_place:
        assert in_place.tensor.data_ptr() == mapped[3:].data_ptr()


def test_a_heap_storage_that_starts_a_page_still_shares_its_last_page() -> None:
    """One in 64 of torch's heap storages starts on a page boundary by chance; the rest of its last page is the
    heap's, so it is registered as a copy too (registered in place, a host copy into the heap bytes after it spanned
    a registered and an unregistered page: 'invalid argument' on an H200). A view within whole pages of its storage,
    shared memory, and our copies keep their pages."""
    fake = FakeCuda()
    registry = PageRegistry(fake)
    with page_aligned_heap_bytes(P + 100) as address:
        heap = heap_tensor(address, P + 100)
        assert heap.data_ptr() % P == 0 and not owns_its_pages(heap)
        assert owns_its_pages(heap[:P]) and not owns_its_pages(heap[P:])
        with register_host_tensor(heap, name="heap", registry=registry) as registration:
            copy = registration.tensor
            assert copy.data_ptr() != heap.data_ptr() and torch.equal(copy, heap) and owns_its_pages(copy)
            assert not fake.covered(address + P, address + 2 * P)
        del heap
    assert fake.ranges == {} and registry.ranges() == []
    assert owns_its_pages(torch.arange(10).share_memory_())
