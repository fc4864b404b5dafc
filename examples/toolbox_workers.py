"""Worker processes coordinated by the synchronization toolbox: a start barrier, a job
queue on a Condition (over a ring in shared memory), a pool of GPU slots held with
`with BoundedSemaphore`. The worker that takes job 5 is SIGKILLed while it holds a GPU
slot: its slot comes back, and the others finish every other job.

    python examples/toolbox_workers.py
"""

import multiprocessing as mp
import os
import signal
import time

import shmlocks

N_JOBS, N_WORKERS, GPU_SLOTS = 40, 4, 2
HEAD, TAIL, CLOSED, JOBS = 0, 1, 2, 3  # the ring: two counters, a flag, the jobs


def worker(cond, ring, gpus, start, done):
    start.wait()  # the start line: every worker begins at once
    while True:
        with cond:  # the job queue: wait for a job, or for the end
            cond.wait_for(lambda: ring[HEAD] != ring[TAIL] or ring[CLOSED])
            if ring[HEAD] == ring[TAIL]:
                return
            job = ring[JOBS + ring[HEAD] % N_JOBS]
            ring[HEAD] += 1
        with gpus:  # a GPU slot: given back if this process dies in the block
            if job == 5:
                os.kill(os.getpid(), signal.SIGKILL)  # killed holding a slot
            time.sleep(0.01)  # the work
        done.release()  # a counter: one release per finished job


if __name__ == "__main__":
    cond = shmlocks.Condition()  # its lock: a new shmlocks.RLock
    gpus = shmlocks.BoundedSemaphore(GPU_SLOTS)
    start = shmlocks.Barrier(N_WORKERS + 1)
    done = shmlocks.Semaphore(0)
    ring = mp.RawArray("q", JOBS + N_JOBS)
    workers = [
        mp.Process(target=worker, args=(cond, ring, gpus, start, done)) for _ in range(N_WORKERS)
    ]
    for w in workers:
        w.start()
    start.wait()
    for job in range(N_JOBS):
        with cond:
            ring[JOBS + ring[TAIL] % N_JOBS] = job
            ring[TAIL] += 1
            cond.notify()
    with cond:
        ring[CLOSED] = 1
        cond.notify_all()
    for w in workers:
        w.join()
    slots = sum(gpus.acquire(timeout=5) for _ in range(GPU_SLOTS))  # the dead one's too
    print(
        f"{done.value} of {N_JOBS} jobs done (job 5 died with its worker), "
        f"{slots} of {GPU_SLOTS} GPU slots free, exit codes {[w.exitcode for w in workers]}"
    )
    assert done.value == N_JOBS - 1 and slots == GPU_SLOTS
