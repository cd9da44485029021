#!/usr/bin/python3
"""The client of the power-loss test (crates/cli/tests/e2e_power_loss.rs).

Its writer writes self-describing 4 KiB blocks to an NBD export with libnbd (a real
client), several commands in flight, some with FUA, the others made durable by FLUSH, and
appends a record of every write acknowledged durable to an ack log that it fsyncs.
The ack log lives on the same file system as the nodes' data directories, so after
any power loss of that file system a record that survived was written after the
write's own durability was acknowledged: the write must read back (or a later one).

A block: magic "DRVPWR01", its byte offset in the VDI (u64 LE), the write's
sequence number (u64 LE), the write's block count and this block's index in it
(u32 LE each), then 4064 bytes of xorshift64 stream seeded by (offset, seq). A
reader regenerates the block from its header: a block is either all zeros (never
written), or exactly what some write put at that offset, never anything else.

An ack record, one line: "OFFSET BLOCKS SEQ KIND FNV" where KIND is fua or flush
and FNV is the FNV-1a 64 of the text before it (a torn line does not parse).

Usage: power-loss-client.py write URI ACK_LOG SECONDS SEED
       power-loss-client.py read URI OUT
The second reads the whole export into OUT, block by block where a larger read fails,
and prints "unreadable OFFSET ERRNO" for each 4 KiB block that returns an error (OUT
then has zeros there): after a power loss the test wants every bad block, not the
first one.
"""
import os
import random
import sys
import time

import nbd

BLOCK = 4096
MAGIC = b"DRVPWR01"
MASK = (1 << 64) - 1
DEPTH = 8  # writes in flight at once
MAX_BLOCKS = 8  # a write is 1..8 blocks (4..32 KiB)


def filler(offset, seq):
    """4064 bytes of xorshift64 from (offset, seq), as the Rust reader makes them."""
    x = (offset * 0x9E3779B97F4A7C15 ^ seq * 0xC2B2AE3D27D4EB4F) & MASK or 1
    out = bytearray()
    for _ in range((BLOCK - 32) // 8):
        x ^= (x << 13) & MASK
        x ^= x >> 7
        x ^= (x << 17) & MASK
        out += x.to_bytes(8, "little")
    return out


def block(offset, seq, count, index):
    head = MAGIC + offset.to_bytes(8, "little") + seq.to_bytes(8, "little")
    head += count.to_bytes(4, "little") + index.to_bytes(4, "little")
    return head + filler(offset, seq)


def fnv(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def record(offset, count, seq, kind):
    text = f"{offset} {count} {seq} {kind}"
    return f"{text} {fnv(text):016x}\n"


def read(uri, out_path):
    h = nbd.NBD()
    h.connect_uri(uri)
    size = h.get_size()
    chunk = 64 * BLOCK
    with open(out_path, "wb") as out:
        for offset in range(0, size, chunk):
            n = min(chunk, size - offset)
            try:
                out.write(h.pread(n, offset))
                continue
            except nbd.Error:
                pass
            for b in range(offset, offset + n, BLOCK):
                try:
                    out.write(h.pread(BLOCK, b))
                except nbd.Error as e:
                    print(f"unreadable {b} {e.errno}", flush=True)
                    out.write(bytes(BLOCK))
    h.shutdown()


def write(uri, ack_path, seconds, seed):
    rng = random.Random(seed)
    h = nbd.NBD()
    h.connect_uri(uri)
    if not (h.can_fua() and h.can_flush()):
        sys.exit("the export offers no FUA or no FLUSH")
    size = h.get_size()
    blocks = size // BLOCK
    # Half the writes go to a hot set (the first 16 blocks of every MiB), so blocks
    # are overwritten many times: a stale copy then differs from the acknowledged one.
    hot = [b for b in range(blocks) if b % 256 < 16]
    ack = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    seq = 0
    in_flight = {}  # cookie -> (offset, count, seq, fua)
    busy = set()  # blocks with a write in flight: one at a time per block
    volatile = []  # acknowledged without FUA, not yet covered by a FLUSH
    flush = None  # (cookie, the writes it covers)
    durable = []  # acknowledged durable, not yet in the ack log
    acked = {"fua": 0, "flush": 0}
    end = time.monotonic() + seconds
    while time.monotonic() < end or in_flight or flush or volatile:
        writing = time.monotonic() < end
        while writing and len(in_flight) < DEPTH:
            count = rng.randint(1, MAX_BLOCKS)
            first = rng.choice(hot) if rng.random() < 0.5 else rng.randrange(blocks)
            first = min(first, blocks - count)
            span = set(range(first, first + count))
            if span & busy:
                break
            seq += 1
            offset = first * BLOCK
            data = b"".join(block(offset + i * BLOCK, seq, count, i) for i in range(count))
            fua = rng.random() < 0.3
            cookie = h.aio_pwrite(
                nbd.Buffer.from_bytearray(bytearray(data)),
                offset,
                flags=nbd.CMD_FLAG_FUA if fua else 0,
            )
            in_flight[cookie] = (offset, count, seq, fua)
            busy |= span
        # A FLUSH covers the writes acknowledged before it is sent.
        if flush is None and (len(volatile) >= 16 or (not writing and volatile)):
            flush = (h.aio_flush(), volatile)
            volatile = []
        h.poll(-1)
        while in_flight or flush is not None:
            cookie = h.aio_peek_command_completed()
            if cookie == 0:
                break
            h.aio_command_completed(cookie)  # raises on an NBD error
            if flush is not None and cookie == flush[0]:
                durable += [(o, c, s, "flush") for (o, c, s) in flush[1]]
                flush = None
                continue
            offset, count, s, fua = in_flight.pop(cookie)
            busy -= set(range(offset // BLOCK, offset // BLOCK + count))
            if fua:
                durable.append((offset, count, s, "fua"))
            else:
                volatile.append((offset, count, s))
        if durable:
            os.write(ack, "".join(record(*d) for d in durable).encode())
            os.fsync(ack)
            for d in durable:
                acked[d[3]] += 1
            durable = []
    h.shutdown()
    print(f"writes={seq} acked_fua={acked['fua']} acked_flush={acked['flush']}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"] and len(sys.argv) == 6:
        write(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
    elif sys.argv[1:2] == ["read"] and len(sys.argv) == 4:
        read(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
