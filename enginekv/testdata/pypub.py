#!/usr/bin/python3
"""A KV event publisher in the engines' wire format, for enginekv's tests.

It is not vLLM or SGLang: it builds their payloads by hand with msgpack, in
the layouts their msgspec structs produce (see enginekv/doc.go for the
versions), and speaks their ZeroMQ protocol with pyzmq: a PUB socket sending
[topic, seq u64 BE, payload] and a ROUTER answering replay requests
[identity, b"", start u64 BE] with one reply per buffered batch and an end
marker of seq -1.

The PUB socket is an XPUB so that "wait_subscriber" can wait for a
subscription to arrive (a subscriber sees no difference).

Usage: pypub.py PLAN.json   (or the plan on stdin when no argument is given)
It prints "ready" once bound, runs the plan's steps, prints "done", then
keeps answering replay requests until its standard input closes.

Plan:
  {"pub": "tcp://127.0.0.1:P", "replay": "tcp://127.0.0.1:R" (optional),
   "topic": "", "flavor": "vllm" | "sglang",
   "layout": "array" | "map",          (vllm only; sglang is always array)
   "hashes": "uint" | "bytes",         (vllm only; sglang sends signed int64)
   "reply_with_topic": true | false,   (vllm only; sglang replies without)
   "buffer_steps": 10000,
   "steps": [
     {"op": "wait_subscriber"},
     {"op": "batch", "skip_live": false, "events": [EVENT, ...]},
     {"op": "restart"},                      sequence back to 0, buffer cleared
     {"op": "garbage", "frames_hex": ["..", ..]},
     {"op": "wait_replays", "count": N},     serve until N requests were served
     {"op": "sleep", "ms": N}]}
  EVENT: {"kind": "stored", "hashes": [u64..], "parent": u64 | null,
          "tokens": [..], "block_size": N, "lora_id": N | null,
          "lora_name": str | null, "medium": "GPU"}
       | {"kind": "removed", "hashes": [u64..], "medium": "GPU"}
       | {"kind": "cleared"}
"""

import collections
import json
import os
import sys
import time

import msgpack
import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def signed(h):
    return h - (1 << 64) if h >= (1 << 63) else h


class Pub:
    def __init__(self, plan):
        self.plan = plan
        self.flavor = plan.get("flavor", "vllm")
        self.layout = plan.get("layout", "array")
        self.hashes = plan.get("hashes", "uint")
        self.reply_with_topic = plan.get("reply_with_topic", self.flavor == "vllm")
        self.topic = plan.get("topic", "").encode()
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(plan["pub"])
        self.router = None
        if plan.get("replay"):
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(plan["replay"])
        self.seq = 0
        self.buffer = collections.deque(maxlen=plan.get("buffer_steps", 10000))
        self.replays = 0
        self.subscribed = False

    # --- payloads -------------------------------------------------------
    def hash(self, h):
        if h is None:
            return None
        if self.flavor == "sglang":
            return signed(h)
        if self.hashes == "bytes":
            return os.urandom(24) + h.to_bytes(8, "big")
        return h

    def event(self, e):
        k = e["kind"]
        hs = [self.hash(h) for h in e.get("hashes", [])]
        if self.flavor == "sglang":
            # array_like, no omit_defaults: every field, medium included.
            if k == "stored":
                return ["BlockStored", hs, self.hash(e.get("parent")), e["tokens"],
                        e["block_size"], e.get("lora_id"), e.get("medium")]
            if k == "removed":
                return ["BlockRemoved", hs, e.get("medium")]
            return ["AllBlocksCleared"]
        if self.layout == "map":
            if k == "stored":
                return {"type": "BlockStored", "block_hashes": hs,
                        "parent_block_hash": self.hash(e.get("parent")),
                        "token_ids": e["tokens"], "block_size": e["block_size"],
                        "lora_id": e.get("lora_id"), "medium": e.get("medium"),
                        "lora_name": e.get("lora_name"), "group_idx": 0}
            if k == "removed":
                return {"type": "BlockRemoved", "block_hashes": hs,
                        "medium": e.get("medium"), "group_idx": 0}
            return {"type": "AllBlocksCleared"}
        if k == "stored":
            return ["BlockStored", hs, self.hash(e.get("parent")), e["tokens"],
                    e["block_size"], e.get("lora_id"), e.get("medium"),
                    e.get("lora_name")]
        if k == "removed":
            return ["BlockRemoved", hs, e.get("medium")]
        return ["AllBlocksCleared"]

    def payload(self, events):
        return msgpack.packb([time.time(), [self.event(e) for e in events], 0],
                             use_bin_type=True)

    # --- sockets --------------------------------------------------------
    def poll(self, timeout_ms):
        socks = [self.pub] + ([self.router] if self.router else [])
        poller = zmq.Poller()
        for s in socks:
            poller.register(s, zmq.POLLIN)
        for s, _ in poller.poll(timeout_ms):
            if s is self.pub:
                msg = self.pub.recv()
                if msg[:1] == b"\x01":
                    self.subscribed = True
            elif s is self.router:
                self.serve_replay()

    def serve_replay(self):
        frames = self.router.recv_multipart()
        if len(frames) != 3:
            return
        ident, _, start = frames
        start = int.from_bytes(start, "big")
        for seq, buf in self.buffer:
            if seq >= start:
                self.router.send_multipart(self.reply(ident, seq.to_bytes(8, "big"), buf))
        self.router.send_multipart(self.reply(ident, END_SEQ, b"", end=True))
        self.replays += 1

    def reply(self, ident, seq, payload, end=False):
        if self.reply_with_topic:
            return [ident, b"", b"" if end else self.topic, seq, payload]
        return [ident, b"", seq, payload]

    # --- plan -----------------------------------------------------------
    def run(self):
        for step in self.plan.get("steps", []):
            op = step["op"]
            if op == "wait_subscriber":
                deadline = time.time() + 10
                while not self.subscribed and time.time() < deadline:
                    self.poll(20)
            elif op == "batch":
                buf = self.payload(step["events"])
                seq = self.seq
                self.seq += 1
                self.buffer.append((seq, buf))
                if not step.get("skip_live"):
                    self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), buf])
                self.poll(0)
            elif op == "restart":
                self.seq = 0
                self.buffer.clear()
            elif op == "garbage":
                self.pub.send_multipart([bytes.fromhex(f) for f in step["frames_hex"]])
            elif op == "wait_replays":
                deadline = time.time() + 10
                while self.replays < step["count"] and time.time() < deadline:
                    self.poll(20)
            elif op == "sleep":
                deadline = time.time() + step["ms"] / 1000
                while time.time() < deadline:
                    self.poll(10)
        print("done", flush=True)


def main():
    if len(sys.argv) > 1:
        with open(sys.argv[1]) as f:
            plan = json.load(f)
        stdin_is_plan = False
    else:
        plan = json.loads(sys.stdin.readline())
        stdin_is_plan = True
    p = Pub(plan)
    print("ready", flush=True)
    p.run()
    # Serve replays until the test closes our standard input.
    poller = zmq.Poller()
    if p.router:
        poller.register(p.router, zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    while True:
        events = dict(poller.poll(1000))
        if p.router in events:
            p.serve_replay()
        if sys.stdin.fileno() in events:
            if not os.read(sys.stdin.fileno(), 4096):
                break
    del stdin_is_plan
    p.ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
