"""host_runtime.memory: aligned first-fit allocation, free with merging, typed views, clear errors."""
import numpy as np
import pytest

from host_runtime import DeviceMemory, MemoryAccessError, OutOfMemoryError


def test_memory_alloc_aligns_and_does_not_overlap():
    mem = DeviceMemory(4096)
    a = mem.alloc(10, align=64)
    b = mem.alloc(100, align=48)
    c = mem.alloc(1, align=256)
    assert a.addr % 64 == 0 and b.addr % 48 == 0 and c.addr % 256 == 0
    spans = sorted((x.addr, x.end) for x in (a, b, c))
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(spans, spans[1:]))
    assert mem.used_bytes == 111 and mem.free_bytes == 4096 - 111


def test_memory_first_fit_reuses_freed_hole_and_merges():
    mem = DeviceMemory(1024, default_align=16)
    a, b, c = mem.alloc(256), mem.alloc(256), mem.alloc(256)
    b.free()
    d = mem.alloc(200)
    assert d.addr == b.addr  # first hole that fits
    d.free()
    a.free()
    c.free()
    assert mem.free_bytes == 1024 and mem.largest_hole == 1024  # all holes merged back into one
    assert mem.alloc(1024).addr == 0


def test_memory_out_of_memory_names_size_free_and_largest_hole():
    mem = DeviceMemory(1024, default_align=1)
    bufs = [mem.alloc(128) for _ in range(8)]
    for b in bufs[::2]:
        b.free()  # 512 bytes free, in 128-byte holes
    with pytest.raises(OutOfMemoryError) as e:
        mem.alloc(256, name="weights")
    msg = str(e.value)
    assert "256 bytes" in msg and "weights" in msg and "512 of 1024 bytes free" in msg and "largest hole 128" in msg


def test_memory_views_and_typed_read_write():
    mem = DeviceMemory(1024)
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    buf = mem.alloc_array(x, name="x")
    assert np.array_equal(buf.read(np.int32, (3, 4)), x)
    buf.view(np.int32)[0] = -7  # views write through to DRAM
    assert mem.array[buf.addr:buf.addr + 4].view(np.int32)[0] == -7
    buf.write(np.array([5], np.int16), offset=4)
    assert buf.read(np.int16, (1,), offset=4)[0] == 5
    assert buf.entry_index(16, 2) == buf.addr // 16 + 2


@pytest.mark.parametrize("action, match", [
    (lambda m, b: b.write(np.zeros(65, np.uint8)), "does not fit"),
    (lambda m, b: b.read(np.int32, (17,)), "exceeds"),
    (lambda m, b: b.view(np.int32, (3, 3)), "cannot view"),
    (lambda m, b: m.alloc(0), "positive"),
    (lambda m, b: m.alloc(8, align=0), "align"),
    (lambda m, b: DeviceMemory(16).free(b), "another DeviceMemory"),
    (lambda m, b: (b.free(), b.free()), "double free"),
    (lambda m, b: (b.free(), b.view()), "was freed"),
    (lambda m, b: (m.alloc(8, align=8), m.alloc(16, align=8).entry_index(64)), "not aligned"),
])
def test_memory_bad_use_raises_clear_error(action, match):
    mem = DeviceMemory(1024)
    buf = mem.alloc(64, name="b")
    with pytest.raises(MemoryAccessError, match=match):
        action(mem, buf)
