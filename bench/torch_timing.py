"""Timing shared by the PyTorch peer scripts (bench/peer_*.py): CUDA events
around each repetition after warm-up, the same method as bench_common.h."""
import torch


def time_cuda(fn, reps=50, warmup=5):
    """Median and minimum milliseconds of `fn` over `reps` event-timed calls."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    return ms[len(ms) // 2], ms[0]


def median_ms(fn, reps=50, warmup=5):
    return time_cuda(fn, reps, warmup)[0]
