#!/usr/bin/env python3
"""Writes the committed seed corpora fuzz/corpus/npy and fuzz/corpus/attention.

Run once (python3 fuzz/make_seeds.py); the files are committed so the fuzzers and the replay
tests need nothing but the repository. Seeds are small on purpose: libFuzzer mutates small
inputs fastest, and every seed is replayed by the ordinary test run.
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(descr, shape, data=b"", version=1, fortran=False, pad=True):
    shape_text = "(" + "".join(f"{d}, " for d in shape).rstrip(" ") + ")"
    if len(shape) > 1:
        shape_text = "(" + ", ".join(str(d) for d in shape) + ")"
    header = (f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}")
    prefix = 10 if version == 1 else 12
    if pad:
        total = (prefix + len(header) + 1 + 63) // 64 * 64
        header = header + " " * (total - prefix - len(header) - 1) + "\n"
    length = struct.pack("<H", len(header)) if version == 1 else struct.pack("<I", len(header))
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + data


def floats(fmt, values):
    return b"".join(struct.pack(fmt, v) for v in values)


NPY = {
    "f4_2x3_v1": npy("<f4", (2, 3), floats("<f", [1, 2, 3, 4, 5, 6])),
    "f8_3_v2": npy("<f8", (3,), floats("<d", [1.5, -2.5, 1e300]), version=2),
    "f4_1x1x2_v3": npy("<f4", (1, 1, 2), floats("<f", [float("nan"), float("-inf")]), version=3),
    "b1_2x2": npy("|b1", (2, 2), bytes([1, 0, 0, 1])),
    "scalar_f8": npy("<f8", (), floats("<d", [3.0])),
    "empty_0x4": npy("<f4", (0, 4)),
    "unpadded": npy("<f4", (2,), floats("<f", [1, 2]), pad=False),
    "big_endian": npy(">f4", (1,), floats(">f", [1])),
    "fortran": npy("<f4", (2, 2), floats("<f", [1, 2, 3, 4]), fortran=True),
    "lying_shape": npy("<f4", (100, 100), floats("<f", [1, 2])),
    "huge_shape": npy("<f8", (4294967296, 4294967296)),
    "truncated": npy("<f8", (4,), floats("<d", [1, 2, 3]))[:-3],
    "int32": npy("<i4", (2,), struct.pack("<ii", 1, 2)),
}


def attention(flags, flags2, extra, dims, corrupt=0, mask=b"", data=b""):
    return bytes([flags, flags2]) + bytes(extra) + bytes(dims) + bytes([corrupt]) + mask + data


def flags(f64=0, impl=0, causal=0, gqa=0, mask=0, lse=0):
    return f64 | impl << 1 | causal << 3 | gqa << 5 | mask << 6 | lse << 7


def flags2(rank=4, mask_dtype=0, scale_mode=0, threads=0):
    return (rank - 2) | mask_dtype << 2 | scale_mode << 4 | threads << 7


RAMP = bytes((i * 29 + 7) % 240 for i in range(400))
ATTENTION = {
    # rank 4: lead (1), Hkv, L, S, E, Ev
    "plain_f32": attention(flags(lse=1), flags2(), [], [1, 2, 3, 5, 4, 3], data=RAMP),
    "plain_f64_reference": attention(flags(f64=1, impl=1, lse=1), flags2(), [], [1, 1, 4, 4, 3, 2],
                                     data=RAMP),
    "gqa_causal_ul": attention(flags(gqa=1, causal=1, lse=1), flags2(), [], [1, 2, 2, 5, 3, 4, 2],
                               data=RAMP),
    "causal_lr_bool_mask": attention(flags(causal=2, mask=1), flags2(mask_dtype=0), [],
                                     [1, 1, 6, 4, 2, 2], mask=bytes([0, 10, 10, 10, 10]),
                                     data=RAMP),
    "float_mask_broadcast": attention(flags(mask=1, lse=1), flags2(mask_dtype=1), [],
                                      [1, 2, 3, 3, 2, 2], mask=bytes([1, 200, 10, 10]),
                                      data=RAMP),
    "rank2": attention(flags(lse=1), flags2(rank=2), [], [0, 4, 6, 3, 5], data=RAMP),
    "rank5_threads": attention(flags(), flags2(rank=5, threads=1), [1], [2, 1, 1, 3, 3, 2, 2],
                               data=RAMP),
    "scale_raw_nan": attention(flags(), flags2(scale_mode=3), list(struct.pack("<d", float("nan"))),
                               [1, 1, 2, 2, 2, 2], data=RAMP),
    "scale_huge": attention(flags(lse=1), flags2(scale_mode=5), [], [1, 1, 2, 3, 2, 2], data=RAMP),
    "corrupt_key_dim": attention(flags(), flags2(), [], [1, 1, 2, 2, 2, 2], corrupt=193,
                                 data=bytes([1]) + RAMP),
    "corrupt_huge_zero_size": attention(flags(), flags2(), [], [1, 1, 2, 2, 0, 2], corrupt=195,
                                        data=bytes([5]) + RAMP),
    "specials": attention(flags(f64=1, lse=1), flags2(), [], [1, 1, 3, 3, 2, 2],
                          data=bytes([240, 241, 242, 243, 244, 245, 246, 247, 248] * 6)),
    "bad_threads": attention(flags(), flags2(threads=1), [4], [1, 1, 2, 2, 2, 2], data=RAMP),
}


def write(target, seeds):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in seeds.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("npy", NPY)
    write("attention", ATTENTION)
    print(f"wrote {len(NPY)} npy seeds and {len(ATTENTION)} attention seeds")
