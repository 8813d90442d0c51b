#!/usr/bin/env python3
"""PyTorch variant of the verbsnet GPU check (docs/gpu-check.md).

Two processes (multiprocessing "spawn") on one GPU join a torch.distributed process group
with the NCCL backend through a file:// rendezvous, all_reduce(sum) float tensors of a few
sizes, and check every element against the exact expected sum (the same data pattern as
report.c). This is how training jobs meet the plugin: the NCCL environment (NCCL_NET,
NCCL_NET_PLUGIN, NCCL_DEBUG, ...) comes from the parent; each child sets its own
NCCL_HOSTID before the process group is created, so NCCL sees two hosts and must use the
network plugin.

Each rank's stdout and stderr (NCCL's C-level log included) go to <log-dir>/rank<N>.log;
rank 0 also writes <log-dir>/table.txt. Exit status 0 only when both ranks exit 0 with no
wrong element.

--backend gloo runs the same logic on the CPU without a GPU (selftest.sh uses it, with
VERBSNET_TORCH_CORRUPT_BYTES=N making rank 1 corrupt one element at size N, gloo only).
"""

import argparse
import datetime
import multiprocessing
import os
import signal
import sys
import time
import traceback

DEFAULT_SIZES = "8,4K,1M,64M"


def parse_bytes(text):
    """'64M' -> 67108864; K, M, G are powers of 1024; an optional trailing B or iB."""
    t = text.strip().upper()
    if t.endswith("B"):
        t = t[:-1]
    if t.endswith("I"):
        t = t[:-1]
    shift = {"K": 10, "M": 20, "G": 30}.get(t[-1:], 0)
    if shift:
        t = t[:-1]
    if not t.isdigit():
        raise argparse.ArgumentTypeError("not a byte count: %r" % text)
    return int(t) << shift


def parse_sizes(text):
    sizes = [parse_bytes(s) for s in text.split(",") if s.strip()]
    if not sizes or min(sizes) < 4:
        raise argparse.ArgumentTypeError("need sizes of at least 4 bytes: %r" % text)
    return sizes


def values(torch, rank, count, seed, device):
    """report.c's vn_value: ((i*7 + seed*13 + rank*101) % 1021) + 1, as float32."""
    i = torch.arange(count, dtype=torch.int64, device=device)
    return ((i * 7 + seed * 13 + rank * 101) % 1021 + 1).to(torch.float32)


def child(rank, args):
    """One rank. Runs in a fresh (spawned) interpreter; returns through its exit code."""
    log_path = os.path.join(args.log_dir, "rank%d.log" % rank)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    # Redirect the file descriptors, so NCCL's own (C) output lands in the same log.
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)

    # Before torch creates any NCCL communicator: each rank its own "host".
    os.environ["NCCL_HOSTID"] = "%s%d" % (args.hostid_prefix, rank)
    try:
        wrong_total = run_rank(rank, args)
    except BaseException:  # noqa: BLE001 - report everything, then fail
        print("# torch-check rank %d FAILED with an exception:" % rank, flush=True)
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
    print("# torch-check rank %d done: wrong %d: %s"
          % (rank, wrong_total, "OK" if wrong_total == 0 else "FAILED"), flush=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if wrong_total == 0 else 1)


def run_rank(rank, args):
    import torch
    import torch.distributed as dist

    if args.backend == "nccl":
        device = torch.device("cuda", args.device)
        torch.cuda.set_device(device)
        sync = torch.cuda.synchronize
    else:
        device = torch.device("cpu")

        def sync():
            pass

    nccl_version = "n/a"
    if args.backend == "nccl":
        try:
            v = torch.cuda.nccl.version()
            nccl_version = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception as e:  # noqa: BLE001
            nccl_version = "unknown (%s)" % e
    # The line format matches run-gpu-check.sh's version probe ("NCCL version X.Y.Z").
    print("# torch-check rank %d/%d pid %d torch %s backend %s device %s, torch's NCCL version %s, "
          "NCCL_HOSTID=%s" % (rank, args.world_size, os.getpid(), torch.__version__,
                              args.backend, device, nccl_version,
                              os.environ.get("NCCL_HOSTID")), flush=True)

    dist.init_process_group(
        backend=args.backend,
        init_method="file://" + args.init_file,
        world_size=args.world_size,
        rank=rank,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    n = args.world_size
    table = None
    if rank == 0:
        table = open(os.path.join(args.log_dir, "table.txt"), "w")
        header = ("#%13s %14s %8s %6s %11s %8s %8s %7s\n" % (
            "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong")
            + "#%13s %14s %8s %6s %11s %8s %8s %7s\n" % (
                "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""))
        sys.stdout.write(header)
        table.write(header)

    wrong_total = 0
    busbw_sum = 0.0
    for k, size in enumerate(args.sizes):
        seed = k + 1
        count = size // 4
        nbytes = count * 4
        mine = values(torch, rank, count, seed, device)
        expected = sum(values(torch, r, count, seed, device) for r in range(n))
        x = mine.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)  # also the warm-up (first one connects)
        sync()
        if (args.backend == "gloo" and rank == 1
                and os.environ.get("VERBSNET_TORCH_CORRUPT_BYTES") == str(nbytes)):
            x[count // 2] += 1  # self-test hook (gloo only): the check must see this
        wrong = int((x != expected).sum().item())
        if wrong:
            bad = int((x != expected).nonzero()[0].item())
            print("# torch-check rank %d: %d of %d elements wrong at %d bytes; first at [%d]: got %r want %r"
                  % (rank, wrong, count, nbytes, bad, float(x[bad]), float(expected[bad])), flush=True)
        iters = max(2, min(20, (1 << 30) // max(nbytes, 1)))
        t0 = time.perf_counter()
        for _ in range(iters):
            x.copy_(mine)
            dist.all_reduce(x, op=dist.ReduceOp.SUM)
        sync()
        time_us = (time.perf_counter() - t0) * 1e6 / iters
        wrong += int((x != expected).sum().item())
        # Sum the wrong counts over ranks, as the C check does.
        w = torch.tensor([wrong], dtype=torch.int64, device=device)
        dist.all_reduce(w, op=dist.ReduceOp.SUM)
        sync()
        global_wrong = max(int(w.item()), wrong)
        wrong_total += global_wrong
        algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
        busbw = algbw * 2.0 * (n - 1) / n
        busbw_sum += busbw
        if table is not None:
            row = " %13d %14d %8s %6s %11.2f %8.3f %8.3f %7d\n" % (
                nbytes, count, "float", "sum", time_us, algbw, busbw, global_wrong)
            sys.stdout.write(row)
            table.write(row)
            table.flush()
    if table is not None:
        footer = ("# Out of bounds values : %d %s\n" % (wrong_total, "OK" if wrong_total == 0 else "FAILED")
                  + "# Avg bus bandwidth    : %.4f\n" % (busbw_sum / len(args.sizes))
                  + "# Rows                 : %d\n" % len(args.sizes))
        sys.stdout.write(footer)
        table.write(footer)
        table.close()
    dist.destroy_process_group()
    return wrong_total


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--log-dir", required=True)
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes(DEFAULT_SIZES),
                   help="comma-separated byte counts (default %s)" % DEFAULT_SIZES)
    p.add_argument("--backend", choices=("nccl", "gloo"), default="nccl")
    p.add_argument("--device", type=int, default=0, help="CUDA device every rank uses")
    p.add_argument("--hostid-prefix", default="verbsnet-gpu-check-host")
    p.add_argument("--timeout", type=int, default=90, help="process-group timeout, seconds")
    args = p.parse_args(argv)
    if args.world_size < 1:
        p.error("--world-size must be >= 1")

    os.makedirs(args.log_dir, exist_ok=True)
    args.log_dir = os.path.abspath(args.log_dir)
    args.init_file = os.path.join(args.log_dir, "rendezvous.%d" % os.getpid())
    if os.path.exists(args.init_file):
        os.unlink(args.init_file)

    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=child, args=(r, args), name="rank%d" % r)
             for r in range(args.world_size)]
    def on_signal(signum, frame):
        raise SystemExit(128 + signum)

    # An outer `timeout` signals only this process: take the ranks down with it.
    signal.signal(signal.SIGTERM, on_signal)
    try:
        for pr in procs:
            pr.start()
        deadline = time.monotonic() + args.timeout + 20
        failed_at = None
        while any(pr.is_alive() for pr in procs):
            for pr in procs:
                if pr.exitcode not in (None, 0) and failed_at is None:
                    failed_at = time.monotonic()
            # One rank failed: give the others a short grace to report, then stop them.
            if failed_at is not None and time.monotonic() > failed_at + 15:
                break
            if time.monotonic() > deadline:
                print("torch-check: FAIL: ranks still running after %d s" % (args.timeout + 20),
                      flush=True)
                break
            time.sleep(0.2)
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.terminate()
                pr.join(5)
                if pr.is_alive():
                    pr.kill()
                    pr.join()
    codes = [pr.exitcode for pr in procs]
    for r, c in enumerate(codes):
        print("torch-check: rank %d exit code %s" % (r, c), flush=True)
    table = os.path.join(args.log_dir, "table.txt")
    if os.path.exists(table):
        with open(table) as f:
            sys.stdout.write(f.read())
    if os.path.exists(args.init_file):
        os.unlink(args.init_file)
    ok = all(c == 0 for c in codes)
    if ok:
        print("torch-check: PASS: %d ranks, sizes %s, no wrong element"
              % (args.world_size, ",".join(str(s) for s in args.sizes)), flush=True)
        return 0
    reason = ""
    for r in range(args.world_size):
        path = os.path.join(args.log_dir, "rank%d.log" % r)
        if not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            lines = [ln.rstrip() for ln in f
                     if ("FAILED" in ln and not ln.rstrip().endswith("exception:"))
                     or "Error" in ln or "NCCL WARN" in ln]
        for ln in lines[:3]:
            print("torch-check: rank %d: %s" % (r, ln), flush=True)
        if lines and not reason:
            reason = "; rank %d: %s" % (r, lines[-1][:200])
    print("torch-check: FAIL: exit codes %s%s" % (codes, reason), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
