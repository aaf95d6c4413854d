"""Pipeline parallelism, simulated: the GPipe and 1F1B schedules of ``m`` micro-batches over ``p`` stages,
their idle time (the bubble) and the activations each stage must hold.

Book: Training at scale, "Splitting the model: tensor, pipeline and sequence parallelism".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PipelineSchedule", "pipeline_schedule", "bubble_fraction"]


def bubble_fraction(p: int, m: int) -> float:
    """``(p - 1) / (m + p - 1)``: the bubble as a share of the makespan of a pipeline of ``p`` stages running
    ``m`` micro-batches, GPipe and 1F1B alike (GPipe's ``O((K - 1) / (M + K - 1))`` overhead, Huang et al., 2019).
    Narayanan et al. (2021, §2.2.1) define the *bubble time fraction* over the ideal time instead,
    ``t_pb / t_id = (p - 1) / m``: the same idle time ``(p - 1) (t_f + t_b)``, another denominator.

    Book: Training at scale, "Splitting the model: tensor, pipeline and sequence parallelism".
    """
    if p < 1 or m < 1:
        raise ValueError(f"need p >= 1 stages and m >= 1 micro-batches, got p={p}, m={m}")
    return (p - 1) / (m + p - 1)


@dataclass
class PipelineSchedule:
    """``timeline[s]``: stage ``s``'s operations as ``(start, end, "F3")`` (forward of micro-batch 3) or
    ``"B3"``; ``makespan``; ``bubble`` = idle time / (p x makespan); ``peak_in_flight[s]``: the most
    micro-batches whose activations stage ``s`` holds at once (forward done, backward not yet)."""

    timeline: list[list[tuple[float, float, str]]]
    makespan: float
    bubble: float
    peak_in_flight: list[int]


def _stage_order(kind: str, stage: int, p: int, m: int) -> list[tuple[str, int]]:
    if kind == "gpipe":  # all forwards, then all backwards
        return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]
    warmup = min(p - stage - 1, m)  # 1F1B: fill the pipe, then one forward, one backward
    order = [("F", i) for i in range(warmup)]
    forward, backward = warmup, 0
    while backward < m:
        if forward < m:
            order.append(("F", forward))
            forward += 1
        order.append(("B", backward))
        backward += 1
    return order


def pipeline_schedule(p: int, m: int, kind: str = "1f1b", t_forward: float = 1.0,
                      t_backward: float = 2.0) -> PipelineSchedule:
    """Simulate ``kind`` (``gpipe`` or ``1f1b``): each stage runs its operations in the schedule's order,
    each as soon as its inputs exist (``F(s, i)`` after ``F(s-1, i)``; ``B(s, i)`` after ``B(s+1, i)`` and
    ``F(s, i)``). Both give the bubble ``(p - 1) / (m + p - 1)`` of the makespan (``(p - 1) / m`` of the ideal
    time); 1F1B holds at most ``p - s`` micro-batches of activations on stage ``s`` instead of GPipe's ``m``.

    Book: Training at scale, "Splitting the model: tensor, pipeline and sequence parallelism".
    """
    if kind not in ("gpipe", "1f1b"):
        raise ValueError(f"kind must be 'gpipe' or '1f1b', got {kind!r}")
    bubble_fraction(p, m)  # validates p and m
    orders = [_stage_order(kind, s, p, m) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}
    stage_free, position = [0.0] * p, [0] * p
    timeline: list[list[tuple[float, float, str]]] = [[] for _ in range(p)]
    while any(position[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if position[s] == len(orders[s]):
                continue
            op, i = orders[s][position[s]]
            needs = [("F", s - 1, i)] if op == "F" and s > 0 else []
            if op == "B":
                needs = [("F", s, i)] + ([("B", s + 1, i)] if s < p - 1 else [])
            if all(n in done for n in needs):
                start = max([stage_free[s]] + [done[n] for n in needs])
                end = start + (t_forward if op == "F" else t_backward)
                done[(op, s, i)], stage_free[s] = end, end
                timeline[s].append((start, end, f"{op}{i}"))
                position[s] += 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocked")  # cannot happen for gpipe and 1f1b
    makespan = max(stage_free)
    busy = m * (t_forward + t_backward)
    peaks = []
    for ops in timeline:
        live = peak = 0
        for _, _, label in ops:
            live += 1 if label[0] == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return PipelineSchedule(timeline, makespan, 1 - busy / makespan, peaks)
