#!/usr/bin/env python3
"""An independent reader of TensorFlow's TensorBundle (checkpoint V2) format, standard library only.

It shares no code with dtrain: the LevelDB table of `<prefix>.index` (footer, block handles,
prefix-compressed block entries, block CRCs, snappy blocks), the BundleHeaderProto and
BundleEntryProto fields (hand-decoded protobuf varints), TF's slice keys (OrderedCode of
EncodeTensorNameSlice) and the data shards `<prefix>.data-NNNNN-of-MMMMM` (every tensor's masked
CRC32C; partitioned tensors assembled from their slices, which must cover the tensor exactly once).

    tensor_bundle_parse.py [--json] PREFIX

prints one line per tensor (name, dtype, shape, number of slices, CRC32C of its full bytes) or,
with --json, {"num_shards": N, "tensors": {name: {"dtype", "shape", "slices", "crc32c"}}}.
Exit status 0 when the bundle is sound, 1 (with "error: ..." on stderr) otherwise.
"""

import json
import os
import struct
import sys

DTYPE_SIZES = {1: 4, 2: 8, 3: 4, 4: 1, 5: 2, 6: 1, 9: 8, 10: 1, 14: 2, 17: 2, 19: 2, 22: 4, 23: 8}
DT_STRING = 7
TABLE_MAGIC = 0xDB4775248B80FB57


class BundleError(Exception):
    pass


# --- CRC32C (Castagnoli), LevelDB/TF masking -------------------------------------------------

def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data, crc=0):
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def unmask(masked):
    rot = (masked - 0xA282EAD8) & 0xFFFFFFFF
    return ((rot >> 17) | (rot << 15)) & 0xFFFFFFFF


# --- varints and protobuf fields -------------------------------------------------------------

def varint(buf, pos):
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise BundleError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise BundleError("varint too long")


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    pos = 0
    while pos < len(buf):
        tag, pos = varint(buf, pos)
        number, wtype = tag >> 3, tag & 7
        if wtype == 0:
            value, pos = varint(buf, pos)
        elif wtype == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wtype == 2:
            n, pos = varint(buf, pos)
            if pos + n > len(buf):
                raise BundleError("truncated length-delimited field")
            value, pos = buf[pos:pos + n], pos + n
        elif wtype == 5:
            if pos + 4 > len(buf):
                raise BundleError("truncated fixed32 field")
            value, pos = struct.unpack("<I", buf[pos:pos + 4])[0], pos + 4
        else:
            raise BundleError("unsupported wire type %d" % wtype)
        yield number, wtype, value


def signed64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def parse_shape(buf):
    dims = []
    for number, _, value in fields(buf):
        if number == 2:
            size = 0
            for n2, _, v2 in fields(value):
                if n2 == 1:
                    size = signed64(v2)
            dims.append(size)
        elif number == 3 and value:
            raise BundleError("shape of unknown rank")
    return dims


def parse_slice(buf):
    """TensorSliceProto -> [(start, length or -1 for a full dimension)]."""
    extents = []
    for number, _, value in fields(buf):
        if number != 1:
            continue
        start, length = 0, -1
        for n2, _, v2 in fields(value):
            if n2 == 1:
                start = signed64(v2)
            elif n2 == 2:
                length = signed64(v2)
        extents.append((start, length) if length >= 0 else (0, -1))
    return extents


def parse_entry(buf):
    e = {"dtype": 0, "shape": [], "shard_id": 0, "offset": 0, "size": 0, "crc32c": 0, "slices": []}
    for number, _, value in fields(buf):
        if number == 1:
            e["dtype"] = value
        elif number == 2:
            e["shape"] = parse_shape(value)
        elif number == 3:
            e["shard_id"] = value
        elif number == 4:
            e["offset"] = value
        elif number == 5:
            e["size"] = value
        elif number == 6:
            e["crc32c"] = value
        elif number == 7:
            e["slices"].append(parse_slice(value))
    return e


# --- OrderedCode: TF's EncodeTensorNameSlice -------------------------------------------------

def oc_num_increasing(v):
    payload = v.to_bytes((v.bit_length() + 7) // 8, "big") if v else b""
    return bytes([len(payload)]) + payload


def oc_escape(s):
    """OrderedCode WriteString's escaping (00 -> 00 ff, ff -> ff 00); the caller appends 00 01."""
    out = bytearray()
    for b in s:
        if b == 0:
            out += b"\x00\xff"
        elif b == 0xFF:
            out += b"\xff\x00"
        else:
            out.append(b)
    return bytes(out)


def oc_signed_num_increasing(v):
    """n bytes hold [-2^(7n-1), 2^(7n-1)): the n-byte two's complement value with its top n bits
    flipped (a unary length header, the sign bit right after it)."""
    x = -v - 1 if v < 0 else v
    n = 1
    while x >= 1 << (7 * n - 1):
        n += 1
    if n > 10:
        raise BundleError("number too large for OrderedCode")
    enc = (v % (1 << (8 * n))) ^ (((1 << n) - 1) << (7 * n))
    return enc.to_bytes(n, "big")


def slice_key(name, extents):
    out = oc_num_increasing(0) + oc_escape(name.encode()) + b"\x00\x01"
    out += oc_num_increasing(len(extents))
    for start, length in extents:
        out += oc_signed_num_increasing(start) + oc_signed_num_increasing(length)
    return out


# --- LevelDB table ---------------------------------------------------------------------------

def snappy_decompress(buf):
    n, pos = varint(buf, 0)
    out = bytearray()
    while pos < len(buf):
        tag = buf[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:
            length = tag >> 2
            if length >= 60:
                extra = length - 59
                length = int.from_bytes(buf[pos:pos + extra], "little")
                pos += extra
            length += 1
            out += buf[pos:pos + length]
            pos += length
            continue
        if kind == 1:
            length = ((tag >> 2) & 7) + 4
            offset = ((tag >> 5) << 8) | buf[pos]
            pos += 1
        elif kind == 2:
            length = (tag >> 2) + 1
            offset = int.from_bytes(buf[pos:pos + 2], "little")
            pos += 2
        else:
            length = (tag >> 2) + 1
            offset = int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        if offset == 0 or offset > len(out):
            raise BundleError("bad snappy copy offset")
        for _ in range(length):
            out.append(out[-offset])
    if len(out) != n:
        raise BundleError("snappy block decompresses to %d bytes, header says %d" % (len(out), n))
    return bytes(out)


def read_block(data, handle, what):
    offset, pos = varint(handle, 0)
    size, _ = varint(handle, pos)
    if offset + size + 5 > len(data):
        raise BundleError("%s: block [%d, %d) outside the file" % (what, offset, offset + size))
    block = data[offset:offset + size]
    kind = data[offset + size]
    stored = struct.unpack("<I", data[offset + size + 1:offset + size + 5])[0]
    if crc32c(block + bytes([kind])) != unmask(stored):
        raise BundleError("%s: block checksum mismatch at offset %d" % (what, offset))
    if kind == 1:
        block = snappy_decompress(block)
    elif kind != 0:
        raise BundleError("%s: bad block type %d" % (what, kind))
    return block


def block_entries(block, what):
    if len(block) < 4:
        raise BundleError("%s: block too short" % what)
    num_restarts = struct.unpack("<I", block[-4:])[0]
    limit = len(block) - 4 - 4 * num_restarts
    if limit < 0:
        raise BundleError("%s: bad restart count" % what)
    pos, key = 0, b""
    while pos < limit:
        shared, pos = varint(block, pos)
        unshared, pos = varint(block, pos)
        vlen, pos = varint(block, pos)
        if shared > len(key) or pos + unshared + vlen > limit:
            raise BundleError("%s: corrupt block entry" % what)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        yield key, block[pos:pos + vlen]
        pos += vlen


def read_table(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 48:
        raise BundleError("%s: shorter than a table footer" % path)
    footer = data[-48:]
    if struct.unpack("<Q", footer[40:])[0] != TABLE_MAGIC:
        raise BundleError("%s: bad table magic" % path)
    _, pos = varint(footer, 0)  # metaindex offset
    _, pos = varint(footer, pos)  # metaindex size
    index_handle = footer[pos:40]
    index = read_block(data, index_handle, path + " index block")
    table = []
    for _, handle in block_entries(index, path + " index block"):
        for key, value in block_entries(read_block(data, handle, path), path):
            if table and key <= table[-1][0]:
                raise BundleError("%s: keys out of order" % path)
            table.append((key, value))
    return table


# --- the bundle --------------------------------------------------------------------------------

def parse_bundle(prefix):
    table = read_table(prefix + ".index")
    if not table or table[0][0] != b"":
        raise BundleError("%s.index: no header entry" % prefix)
    num_shards, big_endian = 1, False
    for number, _, value in fields(table[0][1]):
        if number == 1:
            num_shards = value
        elif number == 2:
            big_endian = value != 0
    if big_endian:
        raise BundleError("big-endian bundles are not handled by this parser")
    entries = {k: parse_entry(v) for k, v in table[1:]}
    shards = []
    for s in range(num_shards):
        path = "%s.data-%05d-of-%05d" % (prefix, s, num_shards)
        if not os.path.exists(path):
            raise BundleError("data shard %s is missing" % path)
        with open(path, "rb") as f:
            shards.append(f.read())

    def string_crc(raw, numel, label):
        # TF's WriteStringTensor: varint64 lengths, a masked checksum of the lengths (each fed
        # to the CRC as a 4-byte little-endian uint32, or 8 bytes past 4 GiB), then the bytes.
        pos, crc, lengths = 0, 0, []
        for _ in range(numel):
            n, pos = varint(raw, pos)
            lengths.append(n)
            crc = crc32c(struct.pack("<I", n) if n <= 0xFFFFFFFF else struct.pack("<Q", n), crc)
        if pos + 4 > len(raw) or unmask(struct.unpack("<I", raw[pos:pos + 4])[0]) != crc:
            raise BundleError("%s: string lengths checksum mismatch" % label)
        crc = crc32c(raw[pos:pos + 4], crc)
        pos += 4
        if pos + sum(lengths) != len(raw):
            raise BundleError("%s: string bytes do not match their lengths" % label)
        return crc32c(raw[pos:], crc)

    def payload(key, e, label, numel_if_string=None):
        if not 0 <= e["shard_id"] < num_shards:
            raise BundleError("%s: shard %d of %d" % (label, e["shard_id"], num_shards))
        data = shards[e["shard_id"]]
        if e["offset"] + e["size"] > len(data):
            raise BundleError("%s: bytes [%d, %d) outside its shard" %
                              (label, e["offset"], e["offset"] + e["size"]))
        raw = data[e["offset"]:e["offset"] + e["size"]]
        crc = crc32c(raw) if numel_if_string is None else string_crc(raw, numel_if_string, label)
        if crc != unmask(e["crc32c"]):
            raise BundleError("%s: CRC32C mismatch" % label)
        return raw

    used_slice_keys = set()
    out = {}
    for key, e in entries.items():
        if key.startswith(b"\x00"):
            continue  # a slice entry, read through its tensor
        name = key.decode()
        numel = 1
        for d in e["shape"]:
            numel *= d
        info = {"dtype": e["dtype"], "shape": e["shape"], "slices": len(e["slices"])}
        if e["dtype"] == DT_STRING:
            if e["slices"]:
                raise BundleError("%s: partitioned strings" % name)
            payload(key, e, name, numel)
            out[name] = info
            continue
        elem = DTYPE_SIZES.get(e["dtype"])
        if elem is None:
            raise BundleError("%s: unknown dtype %d" % (name, e["dtype"]))
        if not e["slices"]:
            raw = payload(key, e, name)
            if len(raw) != numel * elem:
                raise BundleError("%s: %d bytes for %d elements" % (name, len(raw), numel))
            info["crc32c"] = crc32c(raw)
            out[name] = info
            continue
        full = bytearray(numel * elem)
        covered = bytearray(numel)
        shape = e["shape"]
        rank = len(shape)
        strides = [1] * rank
        for d in range(rank - 2, -1, -1):
            strides[d] = strides[d + 1] * shape[d + 1]
        for extents in e["slices"]:
            if len(extents) != rank:
                raise BundleError("%s: slice of rank %d" % (name, len(extents)))
            box = [(0, shape[d]) if extents[d][1] < 0 else
                   (extents[d][0], extents[d][0] + extents[d][1]) for d in range(rank)]
            for d in range(rank):
                if box[d][0] < 0 or box[d][1] > shape[d]:
                    raise BundleError("%s: slice outside the shape" % name)
            skey = slice_key(name, extents)
            if skey not in entries:
                raise BundleError("%s: no entry for slice %r" % (name, extents))
            used_slice_keys.add(skey)
            se = entries[skey]
            sshape = [hi - lo for lo, hi in box]
            if se["dtype"] != e["dtype"] or se["shape"] != sshape:
                raise BundleError("%s: slice entry of the wrong dtype or shape" % name)
            raw = payload(skey, se, "%s slice %r" % (name, extents))
            snumel = 1
            for d in sshape:
                snumel *= d
            if len(raw) != snumel * elem:
                raise BundleError("%s: slice holds %d bytes" % (name, len(raw)))
            # Copy element by element (row-major over the slice's box).
            index = [lo for lo, _ in box]
            for i in range(snumel):
                flat = sum(index[d] * strides[d] for d in range(rank))
                if covered[flat]:
                    raise BundleError("%s: slices overlap" % name)
                covered[flat] = 1
                full[flat * elem:(flat + 1) * elem] = raw[i * elem:(i + 1) * elem]
                for d in range(rank - 1, -1, -1):
                    index[d] += 1
                    if index[d] < box[d][1]:
                        break
                    index[d] = box[d][0]
        if not all(covered):
            raise BundleError("%s: slices leave elements uncovered" % name)
        info["crc32c"] = crc32c(bytes(full))
        out[name] = info
    orphans = [k for k in entries if k.startswith(b"\x00") and k not in used_slice_keys]
    if orphans:
        raise BundleError("%d slice entries belong to no tensor" % len(orphans))
    return {"num_shards": num_shards, "tensors": out}


def main(argv):
    args = [a for a in argv[1:] if a != "--json"]
    if len(args) != 1:
        sys.stderr.write(__doc__)
        return 2
    try:
        bundle = parse_bundle(args[0])
    except (BundleError, OSError, UnicodeDecodeError) as e:
        sys.stderr.write("error: %s\n" % e)
        return 1
    if "--json" in argv:
        json.dump(bundle, sys.stdout, indent=1, sort_keys=True)
        sys.stdout.write("\n")
    else:
        print("num_shards %d" % bundle["num_shards"])
        for name, t in sorted(bundle["tensors"].items()):
            print("%s dtype=%d shape=%s slices=%d crc32c=%s" %
                  (name, t["dtype"], t["shape"], t["slices"],
                   "%08x" % t["crc32c"] if "crc32c" in t else "-"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
