#!/usr/bin/env python3
"""Independent derivation of the pinned fingerprints (INVARIANTS C5, C10).

Recomputes, with Python's hashlib only, the fingerprints that core/tests/fingerprint.rs
pins, from the encoding documented in core/src/fingerprint.rs: BLAKE2b with a 32-byte
digest (keyed with the tenant secret for keyed image fingerprints) over a domain tag, then
every field as (name, value), both length-prefixed with u64 little-endian, integers as u64
little-endian. The expected hex values are read from the Rust test file, so the two sides
check the same numbers. Exit status 1 on any mismatch.
"""
import hashlib
import re
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST = ROOT / "core" / "tests" / "fingerprint.rs"


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def field(h, name: str, value: bytes) -> None:
    h.update(u64(len(name)) + name.encode() + u64(len(value)) + value)


def model_fp(tenant: str) -> bytes:
    # ModelParts::example(tenant), field by field in the order fingerprint() hashes them.
    h = hashlib.blake2b(digest_size=32)
    h.update(b"moonagent.model-fp.v1")
    for name, value in [
        ("tenant", tenant.encode()),
        ("model_snapshot", b"cc594898137f460bfe9f0759e9844b3ce807cfb5"),
        ("processor_version", b"qwen2_vl_image_processor/4.51.3"),
        ("dtype", b"bf16"),
        ("quantization", b"none"),
        ("visual_adapter", b"none"),
        ("spatial_merge_size", u64(2)),
        ("patch_size", u64(14)),
        ("min_pixels", u64(3136)),
        ("max_pixels", u64(12_845_056)),
        ("parallel.tp", u64(1)),
        ("parallel.dp", u64(1)),
        ("storage_layout", b"contiguous"),
        ("tensor_layout", b"row_major(visual_tokens,hidden)"),
    ]:
        field(h, name, value)
    return h.digest()


def pixels() -> bytes:
    # core/tests/fingerprint.rs pixels(): (i * 2654435761 mod 2^32) >> 13, low byte.
    return bytes((((i * 2_654_435_761) & 0xFFFFFFFF) >> 13) & 0xFF for i in range(24 * 6 * 4))


def image_fp(model: bytes, key: "bytes | None") -> bytes:
    grid, shape, dtype = (1, 4, 6), (24, 6), b"f32"
    if key is None:
        h = hashlib.blake2b(digest_size=32)
        h.update(b"moonagent.image-fp.v1")
    else:
        h = hashlib.blake2b(digest_size=32, key=key)
        h.update(b"moonagent.image-fp.keyed.v1")
    field(h, "model_fp", model)
    field(h, "grid_thw", b"".join(u64(d) for d in grid))
    h.update(u64(len("shape")) + b"shape" + u64(8 * len(shape)))
    h.update(b"".join(u64(d) for d in shape))
    field(h, "dtype", dtype)
    px = pixels()
    assert len(px) == shape[0] * shape[1] * 4
    h.update(u64(len("pixels")) + b"pixels" + u64(len(px)))
    h.update(px)
    return h.digest()


def pinned(name: str) -> str:
    m = re.search(rf'const {name}: &str =\s*"([0-9a-f]{{64}})";', TEST.read_text())
    if not m:
        sys.exit(f"{TEST}: no {name} constant")
    return m.group(1)


def main() -> int:
    model = model_fp("alice")
    got = {
        "PINNED_MODEL_FP": model.hex(),
        "PINNED_IMAGE_FP": image_fp(model, None).hex(),
        # TenantSecret::new(KEY) with KEY = bytes 0, 1, ..., 31 (as in the Rust test).
        "PINNED_KEYED_IMAGE_FP": image_fp(model, bytes(range(32))).hex(),
    }
    bad = 0
    for name, value in got.items():
        want = pinned(name)
        ok = want == value
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name}: python {value}" + ("" if ok else f", rust pins {want}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
