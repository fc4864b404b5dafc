"""A pre-fork asyncio server: several worker processes serialize a critical section with
``async with lock:`` and survive a ``kill -9`` of the worker that holds it.

The parent opens one listening socket and forks WORKERS processes, each an asyncio server
on it (as gunicorn or uvicorn workers share theirs). Every request moves one unit in a
ledger kept in shared memory, in two steps with an ``await`` between them, so the
invariant ``a + b == 0`` is broken for a moment inside the section:

    async with lock:
        a += 1; await asyncio.sleep(...); b -= 1

The lock is a shmlocks lock, so a task waiting for it never blocks its worker's event loop
(other requests go on being served) and nothing polls. The parent sends requests from
many clients at once, and SIGKILLs the worker that holds the lock, mid-update. The next
request that takes the lock, in another worker, sees ``lock.owner_died``, repairs the
ledger (b = -a) and calls ``mark_consistent()``. The server keeps answering; at the end
the ledger is whole and every answered request is counted once.

    python examples/asyncio_workers.py [kind]
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import socket
import sys
import time

import shmlocks

WORKERS = 3
CLIENTS = 20
REQUESTS = 15  # per client


def serve(lock: shmlocks.Lock, ledger, sock: socket.socket) -> None:
    """One worker process: an asyncio server on the shared listening socket."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readline():
            async with lock:
                if lock.owner_died:  # a worker died inside: a + b may be off by one
                    ledger[1] = -ledger[0]
                    ledger[3] += 1  # repairs made
                    lock.mark_consistent()
                ledger[2] = os.getpid()  # who is inside (the parent kills it)
                ledger[0] += 1
                await asyncio.sleep(0.002)  # other requests run here meanwhile
                ledger[1] -= 1
                ledger[4] += 1  # requests served
                n = ledger[4]
            writer.write(f"{n}\n".encode())
            await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, sock=sock)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def client(port: int, answers: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for _ in range(REQUESTS):
        try:
            writer.write(b"move\n")
            await writer.drain()
            line = await reader.readline()
        except (ConnectionResetError, BrokenPipeError):
            line = b""  # killed with our request unread: the kernel reset the connection
        if not line:  # our worker was the one killed: connect again
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            continue
        answers.append(int(line))
    writer.close()


async def stopped(pid: int) -> None:
    """Until process `pid` is stopped (a signal is delivered when it next runs)."""
    for _ in range(1000):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        await asyncio.sleep(0.001)


async def kill_a_holder(ledger, workers: dict[int, multiprocessing.Process]) -> int:
    """SIGKILL the worker inside the critical section, mid-update. It is stopped first
    (SIGSTOP) and the ledger read again: a worker that left the section between our look
    and the kill would die holding nothing, and nobody would have a repair to make."""
    while True:
        await asyncio.sleep(0.05)
        pid = ledger[2]
        if pid not in workers or ledger[0] + ledger[1] == 0:
            continue
        os.kill(pid, signal.SIGSTOP)
        await stopped(pid)
        if ledger[2] == pid and ledger[0] + ledger[1] != 0:  # inside, ledger half-updated
            os.kill(pid, signal.SIGKILL)
            return pid
        os.kill(pid, signal.SIGCONT)


async def run_clients(port: int, ledger, workers) -> tuple[list[int], int]:
    answers: list[int] = []
    killer = asyncio.create_task(kill_a_holder(ledger, workers))
    await asyncio.gather(*(client(port, answers) for _ in range(CLIENTS)))
    return answers, await killer


def main() -> int:
    kind = sys.argv[1] if len(sys.argv) > 1 else "mcs"
    ctx = multiprocessing.get_context("fork")
    lock = shmlocks.KINDS[kind].create(max_participants=256)
    ledger = ctx.Array("q", 5, lock=False)  # a, b, pid inside, repairs, served
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    workers = {}
    for _ in range(WORKERS):
        p = ctx.Process(target=serve, args=(lock, ledger, sock), daemon=True)
        p.start()
        workers[p.pid] = p
    try:
        t0 = time.monotonic()
        answers, killed = asyncio.run(run_clients(port, ledger, workers))
        took = time.monotonic() - t0
        with lock:  # the parent waits its turn like anyone
            a, b, _, repairs, served = ledger[:]
    finally:
        for p in workers.values():
            if p.is_alive():
                p.kill()
            p.join()
        sock.close()
        lock.close()
    print(
        f"{kind}: {WORKERS} workers, {len(answers)} requests answered in {took:.2f} s, "
        f"worker {killed} killed holding the lock"
    )
    print(
        f"ledger a={a} b={b} (a + b = {a + b}), repairs after a death: {repairs}, "
        f"sections completed: {served}"
    )
    ok = a + b == 0 and repairs == 1 and len(answers) <= served and answers
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
